"""FSDP2's accumulated-gradient buffer in each torch form accelpact supports (pure logic, fakes).

torch 2.13 keeps ``FSDPParam.unsharded_accumulated_grad`` as a plain attribute; torch 2.15 made it a
read-only property returning ``_unsharded_param.grad``. The reset must clear the first, skip the
second once the leaf's grad is cleared, and refuse a form that still holds a gradient.
"""

from __future__ import annotations

import pytest
import torch

from accelpact.dataplane.reset import _clear_accumulated_grad
from accelpact.errors import AccelPactError


class _Attr213:
    def __init__(self) -> None:
        self.unsharded_accumulated_grad = torch.ones(2)


class _Leaf:
    def __init__(self) -> None:
        self.grad: torch.Tensor | None = torch.ones(2)


class _Prop215:
    def __init__(self) -> None:
        self._unsharded_param = _Leaf()

    @property
    def unsharded_accumulated_grad(self) -> torch.Tensor | None:
        return self._unsharded_param.grad


class _Settable:
    def __init__(self) -> None:
        self._buf: torch.Tensor | None = torch.ones(2)

    @property
    def unsharded_accumulated_grad(self) -> torch.Tensor | None:
        return self._buf

    @unsharded_accumulated_grad.setter
    def unsharded_accumulated_grad(self, v: torch.Tensor | None) -> None:
        self._buf = v


def test_plain_attribute_is_cleared() -> None:
    fp = _Attr213()
    _clear_accumulated_grad(fp)
    assert fp.unsharded_accumulated_grad is None


def test_settable_property_is_cleared() -> None:
    fp = _Settable()
    _clear_accumulated_grad(fp)
    assert fp.unsharded_accumulated_grad is None


def test_read_only_property_after_leaf_cleared_is_left_alone() -> None:
    fp = _Prop215()
    fp._unsharded_param.grad = None  # what _reset_fsdp2 does first
    _clear_accumulated_grad(fp)  # must not raise "has no setter"
    assert fp.unsharded_accumulated_grad is None


def test_read_only_property_still_holding_a_gradient_raises() -> None:
    fp = _Prop215()  # leaf grad NOT cleared: a torch where the buffer lives elsewhere
    with pytest.raises(AccelPactError, match="torch>=2.13,<2.16"):
        _clear_accumulated_grad(fp)


def test_installed_torch_form_is_handled() -> None:
    """The installed torch's real FSDPParam class is one of the handled forms."""
    import inspect

    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    attr = inspect.getattr_static(FSDPParam, "unsharded_accumulated_grad", None)
    # 2.13: an annotation only (assigned in __init__); 2.15: a property
    assert attr is None or isinstance(attr, property)
