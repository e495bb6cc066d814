# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean services-check

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

services-check:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "redis-server not found: installing it (apt-get install -y redis-server)"; \
	    (apt-get update -q && apt-get install -y -q redis-server) >/dev/null; \
	  else \
	    echo "redis-server is required: install it (e.g. 'sudo apt-get install -y redis-server') and re-run"; exit 1; \
	  fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "chromium not found: installing it for the browser engine (apt-get install -y chromium chromium-driver)"; \
	    (apt-get update -q && apt-get install -y -q chromium chromium-driver) >/dev/null; \
	  else \
	    echo "note: the browser engine needs Debian's chromium ('sudo apt-get install -y chromium chromium-driver'); its tests are skipped"; \
	  fi; }

demo: $(STAMP) services-check
	$(BIN)/python scripts/demo.py

PYTEST_ARGS ?=
test: $(STAMP) services-check
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

BENCH_ARGS ?=
bench: $(BENCH_STAMP) services-check
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache *.egg-info
