"""Synthetic batches are a pure function of (seed, step, rank)."""

import torch

from harness.rank.data import make_batch


def test_same_inputs_same_tokens():
    a = make_batch(3, 17, 1, 4, 64, 1000)
    b = make_batch(3, 17, 1, 4, 64, 1000)
    assert torch.equal(a, b)
    assert a.shape == (4, 64) and a.dtype == torch.int64
    assert int(a.min()) >= 0 and int(a.max()) < 1000


def test_each_coordinate_changes_the_batch():
    base = make_batch(0, 5, 0, 4, 64, 1000)
    for other in (make_batch(1, 5, 0, 4, 64, 1000), make_batch(0, 6, 0, 4, 64, 1000), make_batch(0, 5, 1, 4, 64, 1000)):
        assert not torch.equal(base, other)


def test_independent_of_global_rng_state():
    torch.manual_seed(1)
    a = make_batch(0, 0, 0, 2, 16, 500)
    torch.manual_seed(2)
    torch.rand(100)
    assert torch.equal(a, make_batch(0, 0, 0, 2, 16, 500))


def test_sequences_are_learnable_progressions():
    t = make_batch(0, 0, 0, 3, 10, 97)
    stride = (t[:, 1] - t[:, 0]) % 97
    expected = (t[:, :1] + stride.unsqueeze(1) * torch.arange(10)) % 97
    assert torch.equal(t, expected)
