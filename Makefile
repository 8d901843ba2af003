# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and (re)install when the package metadata changed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-oldest docs lint format clean bench gpu-check notebook

$(STAMP): setup.cfg pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[multiworker,dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/keras-dp demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-oldest

# The oldest stack setup.cfg admits (constraints-oldest.txt), installed as a pip user would
# (not editable) into .venv-oldest: the README quickstart, the demo and the report run from
# the installed package, then the core test modules. Part of `make test` (and so of CI).
OLDEST := .venv-oldest
# What differs between versions: reading records (pyarrow, pandas), step counting,
# XProf's step numbering, the Keras bug guard. The rest runs on the newest stack.
OLDEST_TESTS ?= tests/test_records.py tests/test_keras_allreduce_bug.py \
	tests/test_step_timer.py::test_steps_per_execution_gives_one_record_per_call_divided \
	tests/test_step_timer.py::test_steps_a_loss_scale_optimizer_skips_still_count_as_steps \
	tests/test_step_timer.py::test_tf_keras_steps_per_execution \
	tests/test_data_parallel_profiler.py::test_captured_window_opens_in_xprof_with_steps_detected \
	tests/test_data_parallel_profiler.py::test_window_moves_past_keras_tensorboard_profile_batch
$(OLDEST)/.installed: setup.cfg pyproject.toml constraints-oldest.txt
	@test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -c constraints-oldest.txt '.[multiworker]' pytest hypothesis nbformat psutil
	@touch $@

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pip install --quiet --no-deps --force-reinstall .
	$(OLDEST)/bin/python tests/oldest_stack.py
	$(OLDEST)/bin/python -m pytest -p no:cacheprovider $(OLDEST_TESTS)

# The docs site (MkDocs Material, API reference from the docstrings) -> site/. --strict:
# a warning (a broken link, an unreadable docstring) fails, as in tests/test_docs_site.py.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# notebooks/report.ipynb re-executed in place on a fresh 4-replica demo run (about a
# minute), so the outputs saved in it are current. RUN=<log dir>: on that run instead.
RUN ?=
notebook: $(STAMP)
	$(BIN)/python notebooks/regenerate.py $(if $(RUN),--log-dir $(RUN))

# Interleaved A/B benchmarks (about 10 minutes) -> benchmarks/RESULTS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

# The GPU paths on a lent GPU machine, in under 8 minutes -> $(OUT)/REPORT.md
# (docs/gpu_monitor.md). Without a GPU: one line, exit 0. With one: .venv is made if
# missing (seeing the system's packages, e.g. nvidia-ml-py) and the check's first step
# installs into it from this checkout (a wheelhouse/ folder, or pip's cache).
OUT ?= gpu-check
GPU_CHECK_ARGS ?=
gpu-check:
	@if $(PYTHON) -m dev.gpu_check.machine; then \
		test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV); \
		$(BIN)/python -m dev.gpu_check --out $(OUT) $(GPU_CHECK_ARGS); \
	fi

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(OLDEST) runs site build *.egg-info .pytest_cache .ruff_cache
