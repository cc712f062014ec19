# Two commands on a fresh machine: `make demo` (main job) and `make test` (the suite).
# LANE=bridge (default, TransformerLens 4 TransformerBridge) or LANE=legacy (TL 2.18 HookedTransformer).
LANE ?= bridge
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV := $(if $(filter legacy,$(LANE)),.venv-legacy,.venv)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(LANE)

.PHONY: venv demo test docs lint clean

$(STAMP): pyproject.toml constraints/$(LANE).txt docs/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -c constraints/$(LANE).txt -e '.[dev]'
	# the docs toolchain lives in the bridge lane (the suite builds the site strictly there)
	if [ "$(LANE)" = bridge ]; then $(PY) -m pip install -q -r docs/requirements.txt; fi
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tl-directional profile --model default --out demo_out

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

lint: $(STAMP)
	$(VENV)/bin/ruff check tl_directional tests benchmarks

clean:
	rm -rf .venv .venv-legacy demo_out site
