# Two promises: `make demo` and `make test` work on a fresh machine. Each sets up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ecrl-installed
# torch comes pinned from the machine's local wheel store; pyproject keeps a compatible range in its
# `train` extra, which `dev` includes (the base install, `pip install ecrl`, has no torch). Both go
# to one pip call: one resolution (a fresh venv in 71 s against 75 s in two calls).
TORCH  := torch==2.14.1 torchvision==0.29.1
# One worker more than the cores: about an eighth of the suite waits on the clock (polls, start-ups,
# fsync, kills timed into a step), and the extra worker fills that time. On the 2-core machine,
# from a clean clone: 3 workers 18 min 10 s, 2 workers (-n auto) 19 min 06 s (an earlier, slower
# suite). With 3 workers the cores are now busy 96% of the suite's time (/proc/stat sampled every
# 2 s, 2026-11-29): a fourth worker has almost nothing left to fill; only less CPU makes it faster.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
TYPECHECK := $(BIN)/python -m mypy

.PHONY: setup demo test test-long test-gpu lint typecheck bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py ecrl/contract/_native.c verifier/_native.c tests/integration/requirements-streaming.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH) -e '.[dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r tests/integration/requirements-streaming.txt
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ecrl demo

lint: $(STAMP)
	$(BIN)/python -m ruff check ecrl verifier transform tests

typecheck: $(STAMP)
	$(TYPECHECK)

# The suite starts about two thousand Python processes, and this machine (and CI) sets
# PYTHONDONTWRITEBYTECODE=1: without cached bytecode every one of them compiles the project's
# modules again (0.1-0.15 s of CPU each). Compiled here, once, they are read from __pycache__
# (a module edited later is compiled from its source as before: the cache holds its mtime).
#
# The type check (about 40 s of one core on a clean clone) runs beside the suite rather than
# before it: the suite leaves a core idle while its workers start and wait on the clock. Its report
# is printed after the suite's, and either one failing fails `make test`.
test: $(STAMP) lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q ecrl verifier transform
	@log=$$(mktemp); $(TYPECHECK) > "$$log" 2>&1 & types=$$!; \
	echo "$(TYPECHECK) (beside the suite)"; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" --durations=20; \
	tests=$$?; wait $$types; typed=$$?; echo "--- $(TYPECHECK)"; cat "$$log"; \
	rm -f "$$log"; test $$tests -eq 0 && test $$typed -eq 0

# On a CUDA machine: the gpu-marked tests and the drawn failure schedules (hypothesis profile
# `gpu`, tests/integration/test_gpu_schedules.py), one worker per checkpoint strategy. A GPU
# runner whose image already holds torch runs it without the .venv: `make test-gpu
# GPU_PYTHON=python3` (the project on PYTHONPATH, its other dependencies installed). Without CUDA
# it refuses in one line. Deterministic cuBLAS needs its workspace setting before CUDA starts.
GPU_PYTHON ?=
GPU_PY      = $(if $(GPU_PYTHON),$(GPU_PYTHON),$(BIN)/python)
GPU_WORKERS ?= 6

test-gpu: $(if $(GPU_PYTHON),,$(STAMP))
	@$(GPU_PY) -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else "make test-gpu: no CUDA device here (torch " + torch.__version__ + " sees none); run it on a machine with a GPU")'
	CUBLAS_WORKSPACE_CONFIG=:4096:8 HYPOTHESIS_PROFILE=gpu $(GPU_PY) -m pytest -m gpu -n $(GPU_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# Thousands of hypothesis examples and the long integration runs; the kill harness's torch
# programs each in a new interpreter (make test forks them from one that imported torch:
# tests/transform/forkserver.py).
test-long: $(STAMP)
	HYPOTHESIS_PROFILE=long ECRL_TEST_FRESH_INTERPRETERS=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal

bench: $(STAMP)
	$(BIN)/ecrl bench all --write-docs docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
