# Set-up creates .venv inside the checkout (idempotent); torch==2.13.0 (CPU wheel) is installed
# before anything else so no dependency can pull a CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: setup demo test test-slow clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -c constraints.txt "torch==2.13.0"
	$(BIN)/python -m pip install -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: setup
	$(BIN)/python -m gpvi demo

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache
