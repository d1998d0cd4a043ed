"""The environment `make setup` builds prints no warning of its own in every process.

nvidia-resiliency-ext (the `baselines` extra) pulls in the deprecated `pynvml` shim package, whose
import hook made every `import torch.cuda` print "The pynvml package is deprecated" (FutureWarning):
in every rank's log, every harness run, every user's output. `make setup` removes the shim; the
`pynvml` module torch uses comes from nvidia-ml-py. Failed before this branch in a `make setup` venv.
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_torch_cuda_prints_no_pynvml_deprecation_warning():
    # -W default: show FutureWarnings exactly as a user's process would (pytest's own filters do not apply).
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import torch.cuda; import pynvml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pynvml package is deprecated" not in proc.stderr, (
        "the deprecated `pynvml` shim package is installed in this environment: run `make setup` (it "
        "removes it) or `pip uninstall pynvml`; nvidia-ml-py provides the `pynvml` module\n" + proc.stderr[-1000:]
    )
