# One-command entry points. Each target creates .venv and installs on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The CPU wheel is installed first and explicitly: a bare `torch` requirement on a machine
# with no torch would pull a multi-GB CUDA build. On a GPU machine, install the CUDA build
# of torch 2.13 into .venv yourself before running make (see README).
TORCH_SPEC ?= torch==2.13.0

# A second environment on torch 2.15 (docs/torch_versions.md): the accelpact tests and the examples run
# there too (`make test-torch215`, and .ci/run). 2.15 has no CPU-only wheel on PyPI: the default build
# (CUDA libraries included, about 5.4 GB, runs on CPU) takes a few minutes to install, once.
# VENV215 may live outside the checkout so that CI reuses it between runs (.ci/run does).
# PIP215_ENV: this machine's pip configuration caps torch at 2.14.1 (/etc/xdg/pip); ignoring the pip
# configuration lifts the cap. On a machine whose pip configuration you need (a private index), set
# PIP215_ENV= (empty).
VENV215 ?= .venv-torch215
STAMP215 := $(VENV215)/.installed
TORCH215_SPEC ?= torch==2.15.0
PIP215_ENV ?= PIP_CONFIG_FILE=/dev/null

.PHONY: setup run test test-slow reproduce clean slurm-up slurm-down setup-torch215 test-torch215 \
	lint lint-check lint-format lint-types

setup: $(STAMP)

# nvidia-resiliency-ext (the `baselines` extra) requires the `pynvml` package, which since 12.x is
# only a shim: the `pynvml` module itself comes from nvidia-ml-py (also installed, and what torch
# expects), while the shim adds a .pth import hook that makes every `import torch.cuda` print "The
# pynvml package is deprecated" in every process. Removing the shim leaves the module in place.
# (`pip check` then reports that nvidia-resiliency-ext requires pynvml: expected, and harmless.)
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[harness,dev,baselines,lint]"
	$(BIN)/pip uninstall -q -y pynvml
	$(BIN)/python -c "import pynvml" # nvidia-ml-py's module, still there for torch and NVRx
	touch $(STAMP)

setup-torch215: $(STAMP215)

# Reused while up to date: rebuilt only when pyproject.toml or this Makefile changed (the editable install
# then points at this checkout; .ci/run also sets PYTHONPATH so a reused env imports the checkout it tests).
$(STAMP215): pyproject.toml Makefile
	test -x $(VENV215)/bin/python || $(PY) -m venv $(VENV215)
	$(VENV215)/bin/python -c "import torch, sys; sys.exit(not torch.__version__.startswith('2.15.'))" 2>/dev/null \
	  || $(PIP215_ENV) $(VENV215)/bin/pip install -q "$(TORCH215_SPEC)"
	$(PIP215_ENV) $(VENV215)/bin/pip install -q -e ".[harness,dev]"
	$(VENV215)/bin/python -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(not v.startswith('2.15.'))"
	touch $(STAMP215)

# On torch 2.15 (data plane: reconfigure), issue 21's acceptance:
# - every fault phase, nested faults, the stale-gradient trap and the 10-fault run: test_recovery_fsdp2.py;
# - FSDP1: test_recovery_fsdp1.py; HSDP: test_patterns.py (2 ranks, replicate=2 x shard=1) and, in the slow run,
#   its 2 x 2 mesh;
# - the heal tests: test_launcher.py (slow: a SIGKILLed rank healed in memory, the replacement joining the
#   survivors' groups through reconfigure: forked, spawned, a hot spare, and HSDP 2 x 2), guard.run, snapshots,
#   buddy replicas, the heal plan and wait, the heal plan's groups;
# - the reconfigure, reset and recovery-round units; `pip install .` keeps the installed 2.15 (a dry run, offline);
# - examples/recover_one_fault.py (recovers through reconfigure, bit-identically).
# 600 s in all on the 2-core project machine, under load, with a CI run beside it (406 s, 160 s slow, 34 s example).
TESTS215 ?= tests/accelpact/test_recovery_fsdp2.py tests/accelpact/test_recovery_fsdp1.py tests/accelpact/test_patterns.py \
	tests/accelpact/test_guard_run.py tests/accelpact/test_snapshot_fsdp2.py tests/accelpact/test_replica_restore.py \
	tests/accelpact/test_heal_plan.py tests/accelpact/test_heal_wait.py tests/accelpact/test_heal_groups.py \
	tests/accelpact/test_reconfigure_unit.py \
	tests/accelpact/test_reset_compat_unit.py tests/accelpact/test_recovery_rounds_unit.py \
	tests/accelpact/test_consensus.py tests/accelpact/test_gpu_check_unit.py \
	tests/test_packaging.py::test_install_keeps_the_torch_already_installed
# Marked slow, so a pytest run of their own with -m slow (empty: skipped).
TESTS215_SLOW ?= tests/accelpact/test_launcher.py \
	tests/accelpact/test_patterns.py::test_hsdp_on_a_two_by_two_mesh_recovers_bit_identically
# $(PIP215_ENV): the install check's pip must see the machine as a user's would; under this machine's cap
# (torch<=2.14.1) it plans to replace the installed 2.15 with a 2.14 wheel from disk, and fails.
test-torch215: $(STAMP215)
	$(PIP215_ENV) PYTHONPATH=$(CURDIR) $(VENV215)/bin/python -m pytest $(TESTS215) $(PYTEST_ARGS); rc=$$?; \
	  if [ -n "$(strip $(TESTS215_SLOW))" ]; then \
	    PYTHONPATH=$(CURDIR) $(VENV215)/bin/python -m pytest $(TESTS215_SLOW) -m slow $(PYTEST_ARGS) || rc=1; fi; \
	  PYTHONPATH=$(CURDIR) $(VENV215)/bin/python examples/recover_one_fault.py || rc=1; exit $$rc

run: $(STAMP)
	$(BIN)/python -m harness $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# Static checks (the `lint` extra; .ci/run runs them before the tests): ruff's lint rules, ruff's formatting
# and mypy (strict for accelpact, harness checked too); the settings are in pyproject.toml. Every part runs,
# and any finding fails the target. `$(BIN)/ruff format $(LINT_PATHS)` applies the formatting.
LINT_PATHS ?= accelpact harness experiments benchmarks tests examples
MYPY_PATHS ?= accelpact harness
lint: $(STAMP)
	rc=0; $(MAKE) --no-print-directory lint-check || rc=1; $(MAKE) --no-print-directory lint-format || rc=1; \
	  $(MAKE) --no-print-directory lint-types || rc=1; exit $$rc

lint-check: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

lint-format: $(STAMP)
	$(BIN)/ruff format --check $(LINT_PATHS)

lint-types: $(STAMP)
	$(BIN)/mypy $(MYPY_PATHS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# A real multi-node Slurm on this machine (root: apt-get install slurm-wlm munge on first use, then munged,
# slurmctld and SLURM_NODES=2 slurmd, one per network-namespace host; one node where namespaces cannot be
# built) plus the Hydra submitit launcher, for cluster=slurm and the `slurm` tests.
slurm-up: $(STAMP)
	$(BIN)/pip install -q -e ".[slurm]"
	scripts/slurm.sh up

slurm-down:
	scripts/slurm.sh down

reproduce: $(STAMP)
	$(BIN)/python -m experiments.reproduce

clean:
	rm -rf $(VENV) .venv-torch215 outputs multirun
