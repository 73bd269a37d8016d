# The two commands of the README:
#   make demo   installs everything (Python env, control-plane binaries) and runs the demo
#   make test   installs everything (also upstream's library for the CPU twins of
#               serving-models/) and runs every check: ruff, mypy, pytest
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test lint unit bench clean serving-models upstream-cpu-site images push

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

setup: $(VENV)/.installed

# Upstream CosyVoice's library for the CPU twins of the project's model code (serving-models/
# tests, in `make test`): Debian's python3-torchaudio and about 570 MB of pinned PyPI packages
# in ~/.cache/cosyvoice-operator/upstream-cpu-site, once (the script returns at once when the
# cache holds serving-models/cpu-twin-requirements.txt's pins).
upstream-cpu-site: setup
	bash scripts/setup-serving-models.sh

demo: setup
	$(VENV)/bin/cosyvoice-operator demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/actionlint.py

# The operator, engine-builder and serving images with docker, podman or buildah (whichever is
# on PATH; scripts/images.sh says which is needed when none is), named
# REGISTRY/cosyvoice-operator:TAG, REGISTRY/engine-builder:TAG-trtllm0.20.0 and
# REGISTRY/cosyvoice-triton:TAG-trtllm0.20.0 (defaults: ghcr.io/cosyvoice-operator and the
# chart's appVersion, the names the chart uses; install with --set imageRegistry=REGISTRY).
# IMAGES=operator builds one only; BUILDER=podman picks the tool.
images:
	REGISTRY='$(REGISTRY)' TAG='$(TAG)' IMAGES='$(IMAGES)' BUILDER='$(BUILDER)' bash scripts/images.sh build

push:
	REGISTRY='$(REGISTRY)' TAG='$(TAG)' IMAGES='$(IMAGES)' BUILDER='$(BUILDER)' bash scripts/images.sh push

# pytest's testpaths (pyproject.toml): tests/ and serving-models/tests.
test: lint upstream-cpu-site
	$(PY) -m pytest -ra $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest -ra tests/unit tests/engine_builder $(PYTEST_ARGS)

# Only the CPU twins of the project's Triton model code (serving-models/tests: upstream's
# library in the real CPU tritonserver), the quick way to run what `make test` also runs.
serving-models: upstream-cpu-site
	$(PY) -m pytest -ra serving-models/tests $(PYTEST_ARGS)

bench: setup
	$(PY) bench/cluster_up.py

clean:
	rm -rf $(VENV)
