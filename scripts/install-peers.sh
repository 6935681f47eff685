#!/usr/bin/env bash
# Installs two peer benchmark clients, each into a virtual environment of its own under VENV/peers (first argument,
# default .venv), because their pins clash with kvbench's and with each other's:
#   VENV/peers/guidellm  guidellm==0.8.1 (needs torch: pinned to torch==2.13.0 so that pip takes the CPU wheel from
#                        the local find-links instead of GBs of CUDA wheels from PyPI)
#   VENV/peers/aiperf    aiperf==0.13.0 (no torch)
# vLLM's `vllm bench serve`, the third peer, comes with scripts/install-vllm.sh (VENV/vllm).
# Idempotent: a stamp file VENV/peers/<tool>/.kvbench-installed holds the installed spec; a tool whose stamp matches
# is skipped. Needs python3.11 (PYTHON overrides it). Used by scripts/make_peer_fixtures.sh.
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3.11}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PEERS="$VENV/peers"
mkdir -p "$PEERS"

# install NAME IMPORT SPEC...: creates $PEERS/NAME with $PYTHON -m venv and pip-installs SPEC... into it.
install() {
    local name=$1 module=$2; shift 2
    local env="$PEERS/$name" stamp="$PEERS/$name/.kvbench-installed" want="$*"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
        && "$env/bin/python" -c "import $module" >/dev/null 2>&1; then
        echo "$name: already installed in $env ($want)"
        return
    fi
    local start; start=$(date +%s)
    rm -rf "$env"
    "$PYTHON" -m venv "$env"
    "$env/bin/python" -m pip --disable-pip-version-check -q install "$@"
    "$env/bin/python" -c "import $module"
    echo "$want" > "$stamp"
    echo "$name: installed $want into $env in $(( $(date +%s) - start )) s"
    "$env/bin/python" -m pip --disable-pip-version-check show "$name" | grep -E '^(Name|Version):' | paste -sd' '
}

install guidellm guidellm "guidellm==$GUIDELLM_VERSION" "torch==$TORCH_VERSION"
install aiperf aiperf "aiperf==$AIPERF_VERSION"
