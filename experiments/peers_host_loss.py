"""The peers matrix's third fault: AccelPact against torchft, GEMINI, NVRx and cold restart when a host is lost.

    python -m experiments.peers_host_loss             # 2 ages x 5 strategies, 3 trials, into results/peers_host_loss/
    python -m experiments.peers_host_loss --trials 5

``experiments.peers --host-loss`` under its own name, so that the experiment registry has one entry per
results directory. It runs apart from results/peers because a host loss needs hosts: ``cluster=local_hosts``
(each host its own network namespace, so root) and ``fault=host_loss`` (every rank of host 1 SIGKILLed, its
shared memory deleted), where socket_reset and kill run on ``cluster=local_cpu``.
"""

from __future__ import annotations

import sys

from experiments import peers


def main(argv: list[str] | None = None) -> int:
    return peers.main(["--host-loss", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
