# Every target creates .venv when it is missing and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install protos demo test tools check-tools up clean

install: $(STAMP)

# torch first, pinned to the CPU build that lies on local disk (a plain `torch` would pull a
# multi-GB CUDA build); bigvgan last and without its training-only requirements (see pyproject.toml),
# so that pip's resolver, run for the project, never sees its unmet declared requirements. The same for the
# codec decoder's test oracle (cosyvoice2-eu: CosyVoice2's flow and HiFT modules; tests/codec_reference.py), and the
# encoder's (transformers: the Whisper encoder the reference's WhisperVQEncoder derives from; its requirements are
# the project's already, less typer, which the oracle never imports). The two oracles without byte-compiling (transformers:
# 14 -> 2 s): only the test process imports a few of their modules, where pip's .pyc of torch and the rest are read by
# every service process (this environment sets PYTHONDONTWRITEBYTECODE, so a process never writes one). For the same
# reason the dev extras install without byte-compiling (diffusers alone is 1,100 modules; only the test process imports
# a few of them, ~17 s saved), all but triton, which every vocoder process imports (compiled after).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -q "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/triton" > /dev/null
	$(BIN)/pip install -q --no-deps bigvgan==2.4.1
	$(BIN)/pip install -q --no-deps --no-compile cosyvoice2-eu==0.2.8 conformer==0.3.2
	$(BIN)/pip install -q --no-deps --no-compile transformers==5.18.0
	touch $(STAMP)

protos: $(STAMP)
	$(BIN)/python -m services.common.protogen

demo: $(STAMP)
	$(BIN)/python -m services.demo --out demo.wav

up: $(STAMP)
	$(BIN)/moss-serve up

# ruff first (pyproject.toml's [tool.ruff]: pyflakes, pycodestyle, import order): a lint error fails fast.
# compileall: the project's own modules as .pyc (this environment sets PYTHONDONTWRITEBYTECODE, so no process writes
# them, and each of the suite's ~150 service processes would compile them again; Python still reads fresh ones).
# The venv and Debian's tools install side by side (-j2): pip and apt-get wait on different things. In CI (CI=true) a
# tool that could not be installed fails the run (check-tools) instead of skipping a whole feature's tests; -rs lists
# every skip with its reason. The suite in two parts (tests/conftest.py's PARALLEL_MODULES): the modules that may share
# the machine, TEST_WORKERS at a time, then the ones that race clocks, one at a time; both run, and either failing fails.
# One after the other, not side by side: the clock-racing part keeps ~1.3 of 2 cores busy (its services stream in real
# time), so beside it an idle-scheduled first part got ~0.2 of a core and the whole took 1,023 s against ~960 s one
# after the other, while the clock-racing tests failed in three runs of six (2026-12-01: docs/benchmarks.md).
TEST_WORKERS ?= 2
test:
	@$(MAKE) --no-print-directory -j2 install tools
	@$(MAKE) --no-print-directory check-tools
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q services protos tests > /dev/null
	@status=0; \
	$(BIN)/python -m pytest -q -rs --durations=15 -m parallel -n $(TEST_WORKERS) || status=1; \
	$(BIN)/python -m pytest -q -rs --durations=15 -m "not parallel" || status=1; \
	exit $$status

# Debian's prometheus package (the server and promtool) for the deploy checks and the Prometheus
# integration test; espeak-ng (test speech for spoken turns) and sox; chromium (headless: the web page's
# tests). Best effort: without root or apt the tests that need them skip and say why.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
	      || echo "make tools: apt-get install prometheus failed; the promtool and Prometheus tests will skip"; \
	  else echo "make tools: no root/apt to install prometheus; the promtool and Prometheus tests will skip"; fi; }
	@command -v espeak-ng >/dev/null 2>&1 && command -v sox >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends espeak-ng sox >/dev/null 2>&1 \
	      || echo "make tools: apt-get install espeak-ng sox failed; the tests that speak will skip"; \
	  else echo "make tools: no root/apt to install espeak-ng; the tests that speak will skip"; fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
	      || echo "make tools: apt-get install chromium failed; the web page's browser tests will skip"; \
	  else echo "make tools: no root/apt to install chromium; the web page's browser tests will skip"; fi; }

# The tools the suite's feature tests need (the web page, spoken turns, the deploy checks): a note where one is
# missing, and in CI (CI=true) an error, so that no feature passes as a row of skips.
TOOLS := promtool prometheus espeak-ng sox chromium
check-tools:
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$CI" = true ]; then echo "make test: missing in CI:$$missing (make tools installs them as root)" >&2; exit 1; \
	  else echo "make test: missing:$$missing; their tests will skip (make tools installs them as root)"; fi; fi

clean:
	rm -rf $(VENV) demo.wav
