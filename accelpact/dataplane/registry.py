"""The registry of data-plane implementations: :data:`DATA_PLANES`, name -> :class:`DataPlane` subclass.

One module per implementation (rebind.py: new groups under the old names, then a rebind); a new one
adds its entry here. ``GuardConfig.data_plane`` names the one a guard uses.
"""

from __future__ import annotations

from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.rebind import RebindPlane
from accelpact.errors import AccelPactError

__all__ = ["DATA_PLANES", "DataPlane", "RebindPlane", "data_plane_class"]

DATA_PLANES: dict[str, type[DataPlane]] = {RebindPlane.name: RebindPlane}


def data_plane_class(name: str) -> type[DataPlane]:
    """The :class:`DataPlane` implementation registered as ``name``; AccelPactError naming the choices."""
    cls = DATA_PLANES.get(name)
    if cls is None:
        raise AccelPactError(f"unknown data plane {name!r}; registered: {', '.join(sorted(DATA_PLANES))} "
                             "(accelpact.dataplane.DATA_PLANES): set GuardConfig.data_plane to one of them")
    return cls
