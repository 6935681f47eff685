#!/usr/bin/env bash
# kvbench's GPU checks, in about ten minutes on one large GPU (an H100 or an H200). Run from the repository root:
#   bash benchmarks/gpu.sh [--out DIR] [--commit SHA]   # on CUDA: DIR/gpu-<date>-<gpu>.json (DIR: benchmarks/results)
#   bash benchmarks/gpu.sh --dry-run [--out DIR]         # every step on the CPU with tiny shapes, about a minute
# Each step runs even when one before it failed; the file records every step's status, test counts and figures,
# and the script exits 1 after writing it when a step failed or timed out. `kvbench report FILE` prints it again.
# The dry run takes the same steps with the same flags on the tiny-llama preset, short contexts and few steps:
# everything but the CUDA calls runs (the CUDA-only tests are reported skipped, the CPU tests collected, the
# link not measured); its file, marked "dry_run": true, goes into DIR (default: a new temporary folder), never
# into benchmarks/results. --commit names kvbench's commit where the tree is no git checkout.
# Where torch and transformers come preinstalled without kvbench's other wheels, put those in .whl/.
set -euo pipefail
DRY=0 OUT_DIR= COMMIT=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=${2:?--out needs a folder}; shift ;;
    --commit) COMMIT=(--commit "${2:?--commit needs a commit}"); shift ;;
    -h|--help) sed -n '2,11p' "$0" | cut -c3-; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (--dry-run, --out DIR, --commit SHA, --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's kvbench, also for the benchmark scripts
if [ -z "${PY:-}" ]; then
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ "$DRY" = 1 ]; then
  export CUDA_VISIBLE_DEVICES=  # the same run on a GPU machine as on a CPU one
  DEVICE=cpu LARGE=tiny-llama SMALL=tiny-llama DRY_FLAG=(--dry-run)
  OFFLOAD=(--batch 2 --contexts 64 128 --steps 3 --rounds 2 --window 16)
  SAMPLER=(--prompt-tokens 16 --new-tokens 2 --rounds 5 --step-tokens 12 --step-trials 1)
  TIERS=(--batch 2 --contexts 64 --steps 3 --rounds 2)
  CPU_TESTS=(--collect-only) CPU_NOTE="collected, not run: the test suite runs them on the CPU"
  OUT_DIR=${OUT_DIR:-$(mktemp -d)}
else
  DEVICE=cuda LARGE=llama-3.1-8b SMALL=smollm2-1.7b DRY_FLAG=()
  gib=$("$PY" -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30
                                      if torch.cuda.is_available() else 0)')
  if [ "$gib" = 0 ]; then
    echo "gpu.sh: torch sees no CUDA device; bash benchmarks/gpu.sh --dry-run runs the steps on the CPU" >&2
    exit 2
  fi
  # Batch 8 at 32K tokens of context holds 32 GiB of KV twice (the prefill and none's copy) beside 15 GiB of
  # weights: on a GPU under 120 GiB (an H100's 80 GB) the long context is 16K.
  LONG=$([ "$gib" -ge 120 ] && echo 32768 || echo 16384)
  OFFLOAD=(--batch 8 --contexts 8192 "$LONG" --steps 8 --rounds 2 --window 2048)
  SAMPLER=(--prompt-tokens 512 --new-tokens 64 --rounds 20)
  TIERS=(--batch 8 --contexts 8192 --steps 8 --rounds 2)
  CPU_TESTS=() CPU_NOTE=
  OUT_DIR=${OUT_DIR:-benchmarks/results}
fi

# results: gather the steps so far into the results file and print its path (exit 1: a step failed)
results() {
  "$PY" benchmarks/gpu_results.py "$WORK" "$OUT_DIR" "${DRY_FLAG[@]}" "${COMMIT[@]}"
}
# step NAME COMMAND...: run it (on NOTE=... the note it gets), record its exit status and seconds in steps.tsv and
# rewrite the results file: a run stopped midway keeps the steps it finished
step() {
  local name=$1 t0=$SECONDS rc=0 cmd
  shift
  printf -v cmd '%q ' "$@"
  cmd=${cmd% }
  cmd=${cmd//"$WORK"/\$WORK}  # the command as it can be run again, the work folder by name
  echo "== $name: $cmd" >&2
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$cmd" "${NOTE:-}" >> "$WORK/steps.tsv"
  results > /dev/null || true
}
# skipped NAME WHY: a step the dry run does not take on the CPU, recorded as skipped with the reason
skipped() {
  echo "== $1: skipped on the CPU: $2" >&2
  printf '%s\tskipped\t0\t\t%s\n' "$1" "$2" >> "$WORK/steps.tsv"
  results > /dev/null || true
}

# 0. the machine as kvbench sees it: GPU, NVML PCIe generation and width, H2D/D2H bandwidth pinned and pageable
step env "$PY" -m kvbench.cli env --device "$DEVICE" --json > "$WORK/env.json"
if [ "$DRY" = 1 ]; then
  skipped nvidia-smi "needs an NVIDIA driver; kvbench env gives the GPU's name, memory, driver and PCIe link"
else
  step nvidia-smi nvidia-smi --format=csv \
    --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current
fi
# 1. exactness on CUDA: every mode's greedy ids equal DynamicCache's on the device (tiny model, batch 4,
#    left-padded, 40 new tokens; pinned host tier, side-stream copies); then the CPU tests of the same file on
#    this machine's torch and transformers (the dry run only collects them: the test suite runs them)
step cuda-exactness "$PY" -m pytest -q tests/offload/test_offload.py -k cuda -p no:cacheprovider \
  --junitxml="$WORK/cuda-exactness.xml"
NOTE=$CPU_NOTE step cpu-tests "$PY" -m pytest -q tests/offload/test_offload.py -m "not model" -k "not cuda" \
  -p no:cacheprovider "${CPU_TESTS[@]}" --junitxml="$WORK/cpu-tests.xml"
# 2. Llama-3.1-8B shape, random weights, bf16, batch 8: step time vs none and hf-offloaded, H2D per step, peak KV
step offload-overhead timeout 420 "$PY" benchmarks/offload_overhead.py --device "$DEVICE" --preset "$LARGE" \
  --dtype bfloat16 "${OFFLOAD[@]}" --modes none hf-offloaded full hierarchical dynamic \
  --json "$WORK/offload-overhead.json"
# 3. the sampler's cost on CUDA, where each sample also makes five NVML calls (each releases the GIL)
step sampler-overhead timeout 150 "$PY" benchmarks/sampler_overhead.py --device "$DEVICE" --preset "$SMALL" \
  "${SAMPLER[@]}" --json "$WORK/sampler-overhead.json"
# 4. the quantized host tiers: step time ÷ none and link bytes per step of full with each host format
step host-tiers timeout 150 "$PY" benchmarks/host_tiers.py --device "$DEVICE" --preset "$LARGE" --dtype bfloat16 \
  "${TIERS[@]}" --no-quality --json "$WORK/host-tiers.json"

rc=0
FILE=$(results) || rc=$?
if [ -z "$FILE" ]; then
  echo "gpu.sh: the results file could not be written" >&2
  exit 1
fi
"$PY" -m kvbench.cli report "$FILE"
echo "gpu.sh: $FILE"
exit "$rc"
