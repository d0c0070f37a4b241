# wmbook: `make report` runs every notebook and renders an HTML report; `make test` runs pytest.
# Both create ./.venv on first use (reusing a host torch through --system-site-packages) and install
# the exact versions of constraints.txt.
#
#   make report [WORKLOADS=all|mg2|wma] [REPORT=dir] [NOTEBOOKS="01 02"] [ARGS="-p repeats 2"] [PRESET=name]
#   make test   [PYTEST_ARGS="-k runner"]   # ruff, then pytest: under 15 minutes on 2 cores; `make test-all` adds slow ones
#   make test-isa [ISA_TESTS="-m numerics"]  # those tests again with oneDNN and ATen held to AVX2, then AVX512_CORE
#   make test-latest  # the tests against the newest releases of every dependency (./.venv-latest)
#   make lock   # rewrite constraints.txt from the venv (after a deliberate upgrade passed the tests)
#   make lab    [LAB_ARGS="--no-browser --port 8890"]  # JupyterLab on notebooks/
#   make publish NOTEBOOKS=06 WORKLOADS=wma [DEVICE=h200]  # on a GPU: run, publish into data/reports/DEVICE, re-index
#   make strip  # before committing: sync notebooks/NN_*.ipynb with their .py (jupytext), strip (nbstripout)
#   make strip-check  # fail if a notebook has outputs or differs from its .py

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip

# default report folder, fixed once per make invocation (UTC time stamp)
ifeq ($(origin REPORT),undefined)
REPORT := reports/$(shell date -u +%Y%m%dT%H%M%SZ)
endif
PRESET ?=
# every workload by default: a notebook with a `workload` parameter runs once per workload
WORKLOADS ?= all
NOTEBOOKS ?=
ARGS ?=
PYTEST_ARGS ?=
LAB_ARGS ?=
# containers often run as root, which jupyter refuses without this flag
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
TORCH_CPU_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# exact versions to install (empty: none, newest allowed by pyproject.toml)
CONSTRAINTS ?= constraints.txt
# 1: after installing, upgrade every direct dependency to its newest release, past pyproject's tested caps
LATEST ?=

# re-install when pyproject.toml or the constraints change (their checksum is in the stamp's name)
DEPS_SUM := $(firstword $(shell cat pyproject.toml $(CONSTRAINTS) | cksum))
STAMP := $(VENV)/.installed-$(DEPS_SUM)$(if $(LATEST),-latest)

.PHONY: publish report test lint test-isa test-all test-latest lock lab strip strip-check venv clean-venv help chromium published-index

help:
	@sed -n '1,13p' Makefile | sed 's/^# \{0,1\}//'

report: $(STAMP)
	$(VPY) -m wmbook run --out "$(REPORT)" $(if $(WORKLOADS),--workload "$(WORKLOADS)") $(if $(PRESET),--preset "$(PRESET)") $(ARGS) $(NOTEBOOKS)

# TEST_WORKERS: pytest-xdist workers (auto: one per core; 0 runs in this process). Workers steal queued tests from
# each other, so neither idles while the other still has a queue (tests/conftest.py puts the longest modules first).
TEST_WORKERS ?= auto
TEST_DIST := --dist worksteal
# A test run starts about a hundred Python processes that import the package (notebook kernels, gloo ranks, command
# lines): its bytecode is cached by the first of them, also where the environment sets PYTHONDONTWRITEBYTECODE
# (every process would compile the package's sources again, about 1 s each on a slow core).
TEST_ENV := PYTHONDONTWRITEBYTECODE=
test: lint
	$(TEST_ENV) $(VPY) -m pytest -q -n $(TEST_WORKERS) $(TEST_DIST) $(PYTEST_ARGS)

# ruff (settings in pyproject.toml: pyflakes, pycodestyle at 120 columns, import order); `make test` runs it first
lint: $(STAMP)
	$(VPY) -m ruff check .

# The numerics-sensitive tests (marker `numerics`) again on older instruction sets: which bf16 kernels run depends on
# the instructions the CPU really has (oneDNN: AVX512-BF16, AMX, VNNI; ATen: AVX2 or AVX512), so each pass is another
# CPU's arithmetic, and a test that expects one CPU's rounding fails here. ISA_TESTS="" runs the whole suite.
ISA_TESTS ?= -m numerics
ISA_PASSES ?= ONEDNN_MAX_CPU_ISA=AVX2,ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX512_CORE
test-isa: $(STAMP)
	@for pass in $(ISA_PASSES); do \
	    echo "== $$pass"; \
	    env $$(echo $$pass | tr , ' ') $(TEST_ENV) $(VPY) -m pytest -q -n $(TEST_WORKERS) $(TEST_DIST) \
	        -p no:cacheprovider $(ISA_TESTS) \
	        $(PYTEST_ARGS) || exit 1; \
	done

# every test, the slow ones too (full tiny-preset notebook runs of both workloads, long interpreter checks: about
# 35 minutes on 2 cores; `make test` skips them, each covered there by a shorter case, and stays under 15)
test-all: $(STAMP)
	$(TEST_ENV) $(VPY) -m pytest -q -n $(TEST_WORKERS) $(TEST_DIST) --slow $(PYTEST_ARGS)

# headless Chromium for the report screenshot tests (tests/test_report_render.py skips them without it)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# on a GPU host: run NOTEBOOKS for WORKLOADS into a scratch report, publish each finished notebook into
# data/reports/$(DEVICE) as <notebook>-<preset>.html (findings first, no stderr), then that folder's index and the
# generated pages (README glance table, the folders' README.md tables); on a host of another card than DEVICE's it
# stops before running anything (its rows would join the store)
DEVICE ?= h200
publish: $(STAMP)
	$(VPY) -m wmbook.published --check-host data/reports/$(DEVICE)
	-$(VPY) -m wmbook run --out "$(REPORT)" $(if $(WORKLOADS),--workload "$(WORKLOADS)") $(if $(PRESET),--preset "$(PRESET)") $(ARGS) $(NOTEBOOKS)
	$(VPY) -m wmbook.published --publish-report "$(REPORT)" --to data/reports/$(DEVICE)
	$(VPY) -m wmbook.published --index data/reports/$(DEVICE)
	$(VPY) -m wmbook.published --write

# index.html of each published folder: the summary per workload, each report's findings from data/results/results.csv,
# links
published-index: $(STAMP)
	for d in data/reports/h100 data/reports/h200; do $(VPY) -m wmbook.published --index $$d || exit 1; done

# a new release shows up here first, as a deliberate upgrade: if this passes, raise the caps in
# pyproject.toml, `make lock VENV=.venv-latest` and commit both
test-latest:
	$(MAKE) test VENV=.venv-latest CONSTRAINTS= LATEST=1
	@$(VENV)-latest/bin/python -c "from importlib.metadata import version as v; print('tested against', ', '.join(f'{n} {v(n)}' for n in ('torch', 'diffusers', 'transformers', 'numpy')))"

lock: $(STAMP)
	$(VPY) tools/lock.py > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt

lab: $(STAMP)
	@$(VPY) -c "import jupyterlab" >/dev/null 2>&1 || $(PIP) install $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test,lab]'
	$(VPY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (wmbook)"
	JUPYTER_PATH="$(abspath $(VENV))/share/jupyter" $(VPY) -m jupyter lab --notebook-dir=notebooks $(LAB_ROOT_FLAG) $(LAB_ARGS)

# Each notebooks/NN_name.ipynb is paired with the percent-format script NN_name.py (notebooks/jupytext.toml).
# strip: `jupytext --sync` first (inputs from the newer file of each pair; a .py without .ipynb gets one), then
# nbstripout: outputs, execution counts, widget state, execution/papermill metadata go; tags, kernelspec and
# the cell ids (--keep-id: stable cell-NN ids, small diffs) stay. tests/test_notebook_sources.py reads these flags.
NB_GLOB := notebooks/[0-9][0-9]_*
NBSTRIPOUT_FLAGS := --keep-id --extra-keys "metadata.papermill metadata.execution cell.metadata.papermill cell.metadata.widgets"

strip: $(STAMP)
	$(VPY) -m jupytext --sync $(wildcard $(NB_GLOB).ipynb $(NB_GLOB).py)
	$(VPY) -m nbstripout $(NBSTRIPOUT_FLAGS) $(NB_GLOB).ipynb

# exits 1 if a notebook has outputs or run metadata, or its .py is not what jupytext writes from it
strip-check: $(STAMP)
	rc=0; \
	$(VPY) -m nbstripout --verify $(NBSTRIPOUT_FLAGS) $(NB_GLOB).ipynb \
	    || { echo "notebooks with outputs or run metadata (above): run make strip" >&2; rc=1; }; \
	for nb in $(NB_GLOB).ipynb; do \
	    $(VPY) -m jupytext --quiet --to py:percent --output - "$$nb" | cmp -s - "$${nb%.ipynb}.py" \
	        || { echo "$$nb differs from $${nb%.ipynb}.py: run make strip" >&2; rc=1; }; \
	done; \
	exit $$rc

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv --system-site-packages $(VENV) \
	|| $(PYTHON) -m virtualenv --system-site-packages $(VENV)

# torch first, so that `pip install -e .` finds it satisfied and never pulls a CUDA build
# onto a CPU-only machine: a host torch (system site-packages) is reused as is; otherwise
# GPU hosts get the default (CUDA) wheel and CPU hosts a CPU wheel.
$(STAMP): | $(VPY)
	@if $(VPY) -c "import torch" >/dev/null 2>&1; then \
	    echo "torch: using $$($(VPY) -c 'import torch; print(torch.__version__, torch.__file__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
	    echo "torch: GPU host, installing torch"; \
	    $(PIP) install torch; \
	else \
	    echo "torch: no GPU, installing CPU torch"; \
	    $(PIP) install "torch==$(TORCH_CPU_VERSION)" \
	    || $(PIP) install torch --index-url "$(TORCH_CPU_INDEX)"; \
	fi
	$(PIP) install $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	$(if $(LATEST),$(PIP) install --upgrade $$($(VPY) tools/lock.py --direct))
	@rm -f $(VENV)/.installed-*
	@touch $@

clean-venv:
	rm -rf $(VENV)
