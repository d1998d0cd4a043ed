"""The registry of data-plane implementations: :data:`DATA_PLANES`, name -> :class:`DataPlane` subclass.

One module per implementation (rebind.py: new groups under the old names, then a rebind; reconfigure.py:
the same groups reconfigured in place, torch >= 2.15); a new one adds its entry here.
``GuardConfig.data_plane`` names the one a guard uses, or "auto": reconfigure where this torch and every
group support it, else rebind, saying why (:func:`attach_data_plane`).
"""

from __future__ import annotations

from typing import Any

from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.rebind import RebindPlane
from accelpact.dataplane.reconfigure import ReconfigurePlane
from accelpact.errors import AccelPactError

__all__ = [
    "AUTO",
    "DATA_PLANES",
    "DataPlane",
    "RebindPlane",
    "ReconfigurePlane",
    "attach_data_plane",
    "data_plane_class",
]

DATA_PLANES: dict[str, type[DataPlane]] = {RebindPlane.name: RebindPlane, ReconfigurePlane.name: ReconfigurePlane}
#: ``GuardConfig.data_plane``'s default: the in-place plane, which rebinds where it cannot reconfigure
AUTO = "auto"


def data_plane_class(name: str) -> type[DataPlane]:
    """The :class:`DataPlane` implementation registered as ``name``; AccelPactError naming the choices."""
    cls = DATA_PLANES.get(name)
    if cls is None:
        raise AccelPactError(
            f"unknown data plane {name!r}; registered: {', '.join(sorted(DATA_PLANES))} "
            f"(accelpact.dataplane.DATA_PLANES) or {AUTO!r}: set GuardConfig.data_plane "
            "(attach(data_plane=...)) to one of them"
        )
    return cls


def attach_data_plane(name: str, *args: Any, **kwargs: Any) -> DataPlane:
    """The guard's data plane: ``DATA_PLANES[name].attach(*args, **kwargs)``, or for ``"auto"`` the
    reconfigure plane, which takes the rebind path where it cannot reconfigure (its ``last_path`` says
    why). Asking for ``"reconfigure"`` where it is impossible raises, naming the reason and the fix."""
    plane = (ReconfigurePlane if name == AUTO else data_plane_class(name)).attach(*args, **kwargs)
    why_not = getattr(plane, "unsupported", None)
    if name == ReconfigurePlane.name and why_not is not None:
        raise AccelPactError(
            f"data_plane='reconfigure' is not possible: {why_not}; attach with "
            f"data_plane={AUTO!r} (reconfigure where possible, else rebind) or 'rebind'"
        )
    return plane
