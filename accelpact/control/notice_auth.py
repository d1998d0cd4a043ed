"""Signed control-plane messages: death notices carry the job and generation, and an HMAC over both.

The control store (a TCPStore, like torchrun's) has no authentication: anything that can connect to
its port can read and write any key. Every key of a job is prefixed with the job token, so a process
of another job, or an older incarnation of this one, writes under a different prefix and is never
read. A death notice can stop a job, so it gets more than a key name:

- its body names the job (``job``: a short digest of the token, never the token itself) and the
  generation it was written in, and a reader checks both;
- it carries ``mac`` = HMAC-SHA256 over the canonical body with a key derived from the token
  (stdlib ``hmac``/``hashlib``, no new dependency). A writer that knows only the key layout, or
  copies an old notice of another job, cannot produce one that a reader accepts.

What it does not protect against: anyone who learns the token (it is in the ranks' environment and
in every key name on the wire) can derive the key and forge notices. docs/security.md says who can
reach the store and what to do about it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

__all__ = ["job_tag", "sign", "verify", "NoticeRejected"]

_KEY_LABEL = b"accelpact/death-notice/v1"


class NoticeRejected(ValueError):
    """A control-plane message failed its checks; ``str()`` says which one."""


def job_tag(job_token: str) -> str:
    """A public name for the job: 12 hex digits of the token's digest (the token stays unprinted)."""
    return hashlib.sha256(b"accelpact/job/" + job_token.encode()).hexdigest()[:12]


def _key(job_token: str) -> bytes:
    return hashlib.sha256(_KEY_LABEL + b"\0" + job_token.encode()).digest()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in body.items() if k != "mac"}, sort_keys=True, separators=(",", ":")).encode()


def sign(body: dict[str, Any], job_token: str) -> bytes:
    """``body`` (JSON-able) with ``job`` and ``mac`` added, as the bytes to store."""
    full = {**body, "job": job_tag(job_token)}
    full["mac"] = hmac.new(_key(job_token), _canonical(full), hashlib.sha256).hexdigest()
    return json.dumps(full, sort_keys=True).encode()


def verify(raw: bytes | str, job_token: str, *, min_generation: int | None = None) -> dict[str, Any]:
    """The body of a signed message of this job; NoticeRejected if it is unsigned, forged, another
    job's, or from a generation older than ``min_generation`` (a notice without a generation, e.g. a
    launcher's, is accepted: the launcher does not know the ranks' generation)."""
    try:
        body = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError):
        raise NoticeRejected("not JSON") from None
    if not isinstance(body, dict) or "mac" not in body:
        raise NoticeRejected("unsigned")
    if body.get("job") != job_tag(job_token):
        raise NoticeRejected(f"for job {body.get('job')!r}, not this one")
    want = hmac.new(_key(job_token), _canonical(body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(str(body["mac"]), want):
        raise NoticeRejected("bad signature")
    gen = body.get("generation")
    if min_generation is not None and gen is not None and int(gen) < min_generation:
        raise NoticeRejected(f"from generation {gen}, older than {min_generation}")
    return body
