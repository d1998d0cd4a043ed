"""``Registry``: a name -> spec table whose built-in entries load lazily, shared by strategies and faults.

A registry is filled by its package's built-in modules on first use, and by plugins
(``harness.plugins``) through :meth:`Registry.register`. Registering the same spec again is a no-op;
a different spec under a taken name is an error, so a plugin cannot silently replace a built-in.
Plain Python: reading a registry imports neither torch nor Hydra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(
        self, what: str, spec_type: type, name_of: Callable[[T], str], load_builtins: Callable[[], Iterable[T]]
    ) -> None:
        self.what = what  # "strategy", "fault kind": for messages
        self._spec_type = spec_type
        self._name_of = name_of
        self._load_builtins = load_builtins
        self._entries: dict[str, T] = {}
        self._loaded = False

    def _ensure_builtins(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: the built-ins register through register(), which calls us
            for spec in self._load_builtins():
                self.register(spec)

    def register(self, spec: T) -> T:
        if not isinstance(spec, self._spec_type):
            raise TypeError(f"register() takes a {self._spec_type.__name__}, got {type(spec).__name__}")
        self._ensure_builtins()  # a plugin must not take a built-in's name before the built-ins load
        name = self._name_of(spec)
        old = self._entries.get(name)
        if old is not None and old != spec:
            raise ValueError(f"{self.what} {name!r} is already registered; pick another name")
        self._entries[name] = spec
        return spec

    def get(self, name: str) -> T:
        """The spec of ``name``; KeyError naming the registered ones if there is none."""
        self._ensure_builtins()
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._ensure_builtins()
        return sorted(self._entries)

    def specs(self) -> list[T]:
        self._ensure_builtins()
        return list(self._entries.values())
