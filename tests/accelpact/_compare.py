"""Bit-identity against the fault-free reference: every loss, parameter shard and optimizer tensor."""

from __future__ import annotations

import hashlib

import torch


def sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def differences(session, scenario: str, reference: str = "ref") -> list[str]:
    """Every mismatch between ``scenario`` and ``reference`` on every rank ([] when bit-identical)."""
    diffs: list[str] = []
    for rank in range(session.world_size):
        res = session.result(scenario, rank)
        if res is None:
            diffs.append(f"rank {rank}: scenario did not run; log tail:\n{session.logs[rank]}")
            continue
        if res["error"] is not None:
            diffs.append(f"rank {rank}: {res['error']['type']}: {res['error']['message']}\n"
                         f"{res['error']['traceback']}")
            continue
        ref, got = session.tensors(reference, rank), session.tensors(scenario, rank)
        if len(ref["losses"]) != len(got["losses"]):
            diffs.append(f"rank {rank}: {len(got['losses'])} losses, reference has {len(ref['losses'])}")
        for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])):
            if not torch.equal(a, b):
                diffs.append(f"rank {rank}: loss of step {i} {b.item()!r} != reference {a.item()!r}")
        if set(ref["state"]) != set(got["state"]):
            diffs.append(f"rank {rank}: state keys differ: {set(ref['state']) ^ set(got['state'])}")
        for key in sorted(set(ref["state"]) & set(got["state"])):
            a, b = ref["state"][key], got["state"][key]
            if not torch.equal(a, b) or sha256(a) != sha256(b):
                diffs.append(f"rank {rank}: {key} differs (max abs diff "
                             f"{(a.double() - b.double()).abs().max().item():.3e})")
    return diffs
