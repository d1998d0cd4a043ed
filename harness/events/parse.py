"""Raw JSON records to typed events: the one parser, tolerant of newer writers and torn records.

A record of an unknown kind is skipped; one of a known kind that cannot be read is counted in
``ParsedLog.skipped``, never used.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar, Union

from harness.events.kinds import KINDS, Event, MalformedEvent

E = TypeVar("E", bound=Event)


def _check_value(name: str, value: Any, hint: Any, nonfinite: bool) -> Any:
    """``value`` as type ``hint`` wants it, or MalformedEvent. Only the hints of harness.events.kinds are handled."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return _check_value(name, value, inner, nonfinite)
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedEvent(f"{name}: {value!r} is not a number")
        if not nonfinite and not math.isfinite(value):
            raise MalformedEvent(f"{name}: {value!r} is not finite")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MalformedEvent(f"{name}: {value!r} is not an integer")
        return value
    if hint is bool:
        return bool(value)
    if hint is str:
        return str(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise MalformedEvent(f"{name}: {value!r} is not a list")
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise MalformedEvent(f"{name}: {value!r} is not a list of integers") from exc
    if origin is typing.get_origin(Mapping[str, Any]) or hint is Mapping:
        if not isinstance(value, Mapping):
            raise MalformedEvent(f"{name}: {value!r} is not a mapping")
        return dict(value)
    raise TypeError(f"harness.events: no rule for field {name}: {hint!r}")  # a bug in this module


_HINTS: dict[type[Event], dict[str, Any]] = {}


def _hints(cls: type[Event]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def parse_record(record: Mapping[str, Any]) -> Event | None:
    """The typed event of one raw record; None for a kind not in ``KINDS``.

    Raises MalformedEvent for a record without a kind, or a known kind that cannot be read. An optional
    field of the wrong type reads as None (unless marked ``strict``: its readers need it right), and a
    field written as null reads as its default."""
    if not isinstance(record, Mapping) or "kind" not in record:
        raise MalformedEvent("a record without a kind")
    cls = KINDS.get(record["kind"]) if isinstance(record["kind"], str) else None
    if cls is None:
        return None
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "extra" or f.name not in record:
            continue  # a default, or (a required field) the TypeError below
        value, hint = record[f.name], hints[f.name]
        optional = type(None) in typing.get_args(hint)
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if value is None and not optional and has_default:
            continue  # written as null: its default (a duration of None is 0)
        try:
            values[f.name] = _check_value(f.name, value, hint, f.metadata.get("nonfinite", False))
        except MalformedEvent:
            # An optional field of the wrong type reads as None, unless the readers need it to be right.
            if not optional or f.metadata.get("strict"):
                raise
            values[f.name] = None
    values["extra"] = {k: v for k, v in record.items() if k != "kind" and not _declared(cls, k)}
    try:
        event = cls(**values)
    except TypeError as exc:  # a required field is missing
        raise MalformedEvent(f"{cls.KIND}: {exc}") from exc
    event.check()
    return event


def _declared(cls: type[Event], name: str) -> bool:
    return name in _hints(cls) and name != "extra"


@dataclass
class ParsedLog:
    """The typed events of a log, in the records' order, and how many known-kind records were unreadable."""

    events: list[Event] = field(default_factory=list)
    skipped: int = 0


def parse_records(records: Iterable[Mapping[str, Any] | Event]) -> ParsedLog:
    """Type every record (an Event passes through); torn or malformed ones are counted, unknown kinds dropped."""
    out = ParsedLog()
    for record in records:
        if isinstance(record, Event):
            out.events.append(record)
            continue
        try:
            event = parse_record(record)
        except MalformedEvent:
            out.skipped += 1
            continue
        if event is not None:
            out.events.append(event)
    return out


def typed(records: Iterable[Mapping[str, Any] | Event]) -> list[Event]:
    """The readable typed events of ``records`` (raw records or events), malformed ones dropped."""
    return parse_records(records).events


def of_type(events: Iterable[Event], cls: type[E]) -> list[E]:
    """The events of one kind, in order."""
    return [e for e in events if isinstance(e, cls)]
