# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit lint docs bench bench-deps clean services-check

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
	@{ command -v bwrap >/dev/null 2>&1 && command -v nft >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "bubblewrap or nftables not found: installing them for the downloader sandbox (apt-get install -y bubblewrap nftables)"; \
	    (apt-get update -q && apt-get install -y -q bubblewrap nftables) >/dev/null; \
	  else \
	    echo "python and shell downloaders need bubblewrap and nftables ('sudo apt-get install -y bubblewrap nftables') and a root worker"; exit 1; \
	  fi; }
	@command -v redis-sentinel >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "redis-sentinel not found: installing it for the failover test (apt-get install -y redis-sentinel)"; \
	    (apt-get update -q && apt-get install -y -q redis-sentinel) >/dev/null; \
	  else \
	    echo "note: the failover test needs 'sudo apt-get install -y redis-sentinel'; it is skipped"; \
	  fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "chromium not found: installing it for the browser engine (apt-get install -y chromium chromium-driver)"; \
	    (apt-get update -q && apt-get install -y -q chromium chromium-driver) >/dev/null; \
	  else \
	    echo "note: the browser engine needs Debian's chromium ('sudo apt-get install -y chromium chromium-driver'); its tests are skipped"; \
	  fi; }
	@{ command -v soffice >/dev/null 2>&1 && command -v pdftoppm >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "LibreOffice not found: installing it to check exported spreadsheets (apt-get install -y libreoffice-calc-nogui poppler-utils)"; \
	    (apt-get update -q && apt-get install -y -q libreoffice-calc-nogui poppler-utils) >/dev/null; \
	  else \
	    echo "note: the spreadsheet checks need LibreOffice ('sudo apt-get install -y libreoffice-calc-nogui poppler-utils'); they are skipped"; \
	  fi; }

demo: $(STAMP) services-check
	$(BIN)/python scripts/demo.py

# tests/unit starts no services (the inner loop); tests/integration and tests/e2e use real ones.
PYTEST_ARGS ?=
# pytest-xdist: three workers on two cores (the tests wait on processes much of the time); the tests
# that share something of the machine run on one worker, one after another (XDIST_GROUPS in
# tests/conftest.py). XDIST= runs the suite in one process. Timings: docs/testing.md.
XDIST ?= -n 3 --dist loadgroup
# pywb (the WARC replay check of tests/e2e/test_warc.py) pins redis 2.10.6 against our 8.x: it gets a
# venv of its own under var/, built here, before the tests (no test reaches a package index).
PYWB := pywb==2.10.0
PYWB_STAMP := var/pywb-2.10.0/.installed
$(PYWB_STAMP):
	@rm -rf var/pywb-2.10.0 && mkdir -p var
	@$(PYTHON) -m venv var/pywb-2.10.0 && var/pywb-2.10.0/bin/pip install -q '$(PYWB)' >var/pywb-install.log 2>&1 && touch $@ \
	  || echo "note: pywb could not be installed; the WARC replay test will be skipped"

test: $(STAMP) services-check lint $(PYWB_STAMP)
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# ruff (style, imports, likely bugs; 110 columns) and mypy, configured in pyproject.toml; the store
# (common/store/) also under mypy --strict (the modules it imports are checked by the line before).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --strict --follow-imports=silent common/store

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

# The peer (scrapy-redis) in an install of its own, as its users have it: Scrapy brings pyOpenSSL,
# which pymongo then loads at every start, and our processes, run from our own install, do not pay
# for it (docs/benchmarks.md). Its store and Redis clients are pinned to ours, hiredis included.
PEER_VENV := .venv-peer
PEER_PINS := scrapy==2.19.0 scrapy-redis==0.9.1 pymongo==4.20.0 redis==8.1.0 hiredis==3.5.0
BENCH_STAMP := $(PEER_VENV)/.installed
$(BENCH_STAMP): $(STAMP) Makefile
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q $(PEER_PINS)
	touch $(BENCH_STAMP)

# The real-page comparison: nginx serving a documentation tree (Debian's Python docs, ~780 files
# of 10 KB-1 MB). Installed as chromium is; without them that comparison is skipped with a note.
bench-deps:
	@{ command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; } && [ -d /usr/share/doc/python3.11/html ] || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing nginx-light and python3.11-doc for the real-page comparison"; \
	    (apt-get update -q && apt-get install -y -q nginx-light python3.11-doc) >/dev/null; \
	  else \
	    echo "note: the real-page comparison needs 'sudo apt-get install -y nginx-light python3.11-doc'"; \
	  fi; }

BENCH_ARGS ?=
# CENTER_BENCH_ARGS: options of scripts/bench_center.py (the download center's 1,000,000-row pull)
CENTER_BENCH_ARGS ?=
# CRAWL_BENCH_ARGS: options of scripts/bench_crawl.py (a site of 1,000,000 linked pages crawled)
CRAWL_BENCH_ARGS ?=
# CRAWL_CMP_BENCH_ARGS: options of scripts/bench_crawl_compare.py (our crawl against scrapy-redis's)
CRAWL_CMP_BENCH_ARGS ?=
bench: $(BENCH_STAMP) services-check bench-deps
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)
	$(BIN)/python scripts/bench_center.py $(CENTER_BENCH_ARGS)
	$(BIN)/python scripts/bench_crawl.py $(CRAWL_BENCH_ARGS)
	$(BIN)/python scripts/bench_crawl_compare.py $(CRAWL_CMP_BENCH_ARGS)

clean:
	rm -rf $(VENV) $(PEER_VENV) var .pytest_cache *.egg-info

# docs/configuration.md and docs/api-reference.md are generated from settings.py and the API's description.
docs: $(STAMP)
	$(BIN)/python scripts/gendocs.py
