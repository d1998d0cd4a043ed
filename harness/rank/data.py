"""Deterministic synthetic token batches: a pure function of (seed, step, rank).

A retried, replayed or restarted step sees exactly the same tokens, whichever process computes it.
The sequences are learnable (each is an arithmetic progression modulo the vocabulary, with a random
start and a stride from a small set), so the loss falls visibly and a broken training loop shows up
in the loss curve, not only in the state hash.
"""

from __future__ import annotations

import hashlib

import torch

MAX_STRIDE = 16


def batch_seed(seed: int, step: int, rank: int) -> int:
    digest = hashlib.sha256(f"data:{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_batch(seed: int, step: int, rank: int, batch_size: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """Token ids of shape (batch_size, seq_len), int64, on CPU. Use as inputs and as labels."""
    if batch_size <= 0 or seq_len <= 0 or vocab_size <= 1:
        raise ValueError(f"make_batch needs positive sizes, got {batch_size=} {seq_len=} {vocab_size=}")
    gen = torch.Generator().manual_seed(batch_seed(seed, step, rank))
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=gen)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch_size, 1), generator=gen)
    positions = torch.arange(seq_len).unsqueeze(0)
    return (start + stride * positions) % vocab_size
