# One-command entry points. Each target creates .venv and installs on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The CPU wheel is installed first and explicitly: a bare `torch` requirement on a machine
# with no torch would pull a multi-GB CUDA build. On a GPU machine, install the CUDA build
# of torch 2.13 into .venv yourself before running make (see README).
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run test test-slow reproduce clean slurm-up slurm-down

setup: $(STAMP)

# nvidia-resiliency-ext (the `baselines` extra) requires the `pynvml` package, which since 12.x is
# only a shim: the `pynvml` module itself comes from nvidia-ml-py (also installed, and what torch
# expects), while the shim adds a .pth import hook that makes every `import torch.cuda` print "The
# pynvml package is deprecated" in every process. Removing the shim leaves the module in place.
# (`pip check` then reports that nvidia-resiliency-ext requires pynvml: expected, and harmless.)
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[harness,dev,baselines]"
	$(BIN)/pip uninstall -q -y pynvml
	$(BIN)/python -c "import pynvml" # nvidia-ml-py's module, still there for torch and NVRx
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m harness $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

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
	rm -rf $(VENV) outputs multirun
