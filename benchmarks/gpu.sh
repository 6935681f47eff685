#!/usr/bin/env bash
# The GPU checks of issues 3 and 4, in a few minutes on one large GPU (an H200 was the target). Run from the repo root:
#   bash benchmarks/gpu.sh
# On the lent device machine (torch and transformers preinstalled) the wheels kvbench needs beyond those are
# carried in .whl/ (see DEVELOPERS.md and the device README); elsewhere `make setup` is enough.
set -euo pipefail
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=${PY:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
# 0. the machine as kvbench sees it: NVML PCIe generation and width, H2D/D2H bandwidth pinned and pageable
"$PY" -m kvbench.cli env
# 1. exactness on CUDA: every mode's greedy ids equal DynamicCache's on the device (tiny model, batch 4,
#    left-padded, 40 new tokens; pinned host tier, side-stream copies); then the CPU tests of the same file
"$PY" -m pytest -q tests/offload/test_offload.py -k cuda -p no:cacheprovider
"$PY" -m pytest -q tests/offload/test_offload.py -m "not slow" -k "not cuda" -p no:cacheprovider
# 2. Llama-3.1-8B shape, random weights, bf16, batch 8: step time vs none and hf-offloaded, H2D per step, peak KV
timeout 420 "$PY" benchmarks/offload_overhead.py --device cuda --preset llama-3.1-8b --dtype bfloat16 \
  --batch 8 --contexts 8192 32768 --steps 8 --rounds 2 --window 2048 \
  --modes none hf-offloaded full hierarchical dynamic
# 3. the sampler's cost on CUDA, where each sample also makes five NVML calls (each releases the GIL)
timeout 150 "$PY" benchmarks/sampler_overhead.py --device cuda --preset smollm2-1.7b --prompt-tokens 512 \
  --new-tokens 64 --rounds 20
# 4. the quantized host tiers (issue 33): step time ÷ none and link bytes per step of full with each host format
timeout 150 "$PY" benchmarks/host_tiers.py --device cuda --preset llama-3.1-8b --dtype bfloat16 --contexts 8192 \
  --batch 8 --steps 8 --rounds 2 --no-quality
