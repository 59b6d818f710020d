# Two commands on a fresh machine: `make serve` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo.ninfer

.PHONY: install test lint serve demo clean

install: $(STAMP)

# xgrammar depends on torch: without an NVIDIA GPU take the CPU build first so the install stays small.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/pip install -q torch; \
	else \
	  $(BIN)/pip install -q "torch==2.13.0"; \
	fi
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install lint
	$(BIN)/python -m pytest -q

$(DEMO): $(STAMP)
	$(BIN)/ninfer demo -o $(DEMO)

demo: $(DEMO)

# Serves the demo on 127.0.0.1:8010 (the GPU backend when one is present, the NumPy reference otherwise).
serve: $(DEMO)
	@if $(BIN)/python -c "import cupy, sys; sys.exit(cupy.cuda.runtime.getDeviceCount() < 1)" 2>/dev/null; \
	then $(BIN)/ninfer serve $(DEMO) --backend cuda; \
	else $(BIN)/ninfer serve $(DEMO) --backend reference; fi

clean:
	rm -rf $(VENV) build
