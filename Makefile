# The two commands of the README:
#   make demo   installs everything (Python env, control-plane binaries) and runs the demo
#   make test   installs everything and runs every check: ruff, mypy, pytest
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test lint unit bench clean serving-models

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/cosyvoice-operator demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -ra $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -ra tests/unit tests/engine_builder $(PYTEST_ARGS)

# The project's Triton model code (serving-models/) with upstream's library, in the real CPU
# tritonserver. Not in `make test`: it needs scripts/setup-serving-models.sh (about 440 MB).
serving-models: setup
	bash scripts/setup-serving-models.sh
	$(PY) -m pytest -ra serving-models/tests $(PYTEST_ARGS)

bench: setup
	$(PY) bench/cluster_up.py

clean:
	rm -rf $(VENV)
