"""Names and private addresses of one job's network namespaces (pure: no system calls).

Every name a job creates carries its prefix ``ap<6 hex>`` so parallel jobs never clash and a leftover of a
crashed job can be found (``cleanup_stale``). Addresses live in 10.0.0.0/8 and exist only inside the job's
namespaces (rank namespaces get no default route), so no packet can leave them.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

PREFIX_RE = re.compile(r"^ap[0-9a-f]{6}$")
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
MAX_RANKS = 253  # hosts .1 .. .253 of a /24; .254 is the bridge namespace
DATA_IF = "eth0"  # the data plane inside a rank namespace: the link faults hit, gloo is pinned to it
CTL_IF = "ctl0"  # the out-of-band control link inside a rank namespace: never faulted
DATA_BRIDGE = "dbr0"  # in the bridge namespace ("brd" would parse as an `ip` keyword)
CTL_BRIDGE = "cbr0"
BRIDGE_HOST = 254


def new_prefix() -> str:
    """A fresh per-job prefix, e.g. ``ap3f9a1c``."""
    return "ap" + secrets.token_hex(3)


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"netns prefix {prefix!r} must look like 'ap' + 6 hex digits, e.g. 'ap3f9a1c'")
    return prefix


@dataclass(frozen=True)
class Layout:
    """Names and addresses for one job of ``world_size`` ranks.

    ``hosts=None``: one namespace per rank (``<prefix>-r<rank>``), the per-rank link faults.
    ``hosts=N``: N host namespaces (``<prefix>-h<host>``), ``world_size / N`` consecutive ranks in each,
    sharing that host's data and control links, as the ranks of one machine share its NICs. A link
    fault then hits every rank of the host. Addresses, veth peers and namespaces are per host; the
    methods that take a rank map it to its host."""

    prefix: str
    world_size: int
    hosts: int | None = None

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if not 1 <= self.world_size <= MAX_RANKS:
            raise ValueError(f"world_size must be 1..{MAX_RANKS} for one /24 per plane, got {self.world_size}")
        if self.hosts is not None:
            if not 1 <= self.hosts <= self.world_size:
                raise ValueError(f"hosts={self.hosts} must be 1..world_size ({self.world_size})")
            if self.world_size % self.hosts:
                raise ValueError(
                    f"world_size={self.world_size} is not a multiple of hosts={self.hosts}: "
                    "every host holds the same number of ranks"
                )

    # -- hosts
    @property
    def n_hosts(self) -> int:
        return self.world_size if self.hosts is None else self.hosts

    @property
    def ranks_per_host(self) -> int:
        return self.world_size // self.n_hosts

    def host_of(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.ranks_per_host

    def local_rank(self, rank: int) -> int:
        """Index of ``rank`` among the ranks of its host (LOCAL_RANK)."""
        return rank - self.host_of(rank) * self.ranks_per_host

    def ranks_of_host(self, host: int) -> tuple[int, ...]:
        self._check_host(host)
        return tuple(range(host * self.ranks_per_host, (host + 1) * self.ranks_per_host))

    def host_ns(self, host: int) -> str:
        self._check_host(host)
        return f"{self.prefix}-r{host}" if self.hosts is None else f"{self.prefix}-h{host}"

    # -- namespaces
    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def rank_ns(self, rank: int) -> str:
        """The namespace rank ``rank`` runs in (its host's)."""
        return self.host_ns(self.host_of(rank))

    @property
    def host_namespaces(self) -> tuple[str, ...]:
        return tuple(self.host_ns(h) for h in range(self.n_hosts))

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.bridge_ns, *self.host_namespaces)

    # -- the bridge-side ends of the veth pairs (prefixed so they are recognisable wherever they show)
    def data_peer(self, rank: int) -> str:
        return f"{self.prefix}d{self.host_of(rank)}"

    def ctl_peer(self, rank: int) -> str:
        return f"{self.prefix}c{self.host_of(rank)}"

    # -- addresses: one /24 per plane, picked from the prefix so parallel jobs use different ones
    @property
    def _net(self) -> tuple[int, int]:
        h = int(self.prefix[2:], 16)
        return 16 + (h >> 16) % 224, (h & 0x7F) * 2  # 10.<16..239>.<even>.0/24, control on <even + 1>

    @property
    def data_subnet(self) -> str:
        a, b = self._net
        return f"10.{a}.{b}.0/24"

    @property
    def ctl_subnet(self) -> str:
        a, b = self._net
        return f"10.{a}.{b + 1}.0/24"

    def data_addr(self, rank: int) -> str:
        """The data-plane address of ``rank``'s host."""
        a, b = self._net
        return f"10.{a}.{b}.{self.host_of(rank) + 1}"

    def ctl_addr(self, rank: int) -> str:
        """The control-plane address of ``rank``'s host."""
        a, b = self._net
        return f"10.{a}.{b + 1}.{self.host_of(rank) + 1}"

    @property
    def bridge_data_addr(self) -> str:
        a, b = self._net
        return f"10.{a}.{b}.{BRIDGE_HOST}"

    @property
    def bridge_ctl_addr(self) -> str:
        """Where the control store server listens (inside the bridge namespace)."""
        a, b = self._net
        return f"10.{a}.{b + 1}.{BRIDGE_HOST}"

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.n_hosts:
            raise ValueError(f"host {host} outside 0..{self.n_hosts - 1}")
