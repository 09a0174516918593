"""The copy engine a connector adapter's round trip moves bytes through.

A connector's own transfer code decides *which* bytes move where; what actually moves
them (a CUDA copy kernel, ``cudaMemcpyAsync``, an RDMA write, a storage service) is
hardware or an external service, so an adapter fakes exactly that primitive by calling
``CopyEngine.copy``. The engine knows every byte the connector may touch: the storages
vLLM registered (the KV pool) and the host buffers the adapter asked it for. A copy that
reads or writes anywhere else is refused *before* any byte moves (so a wrong address can
never corrupt this process) and recorded as an out-of-pool access.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable

MAX_COPIES = 1 << 20
"""Copies one round trip may issue: more is an endless loop in the connector's planning."""


@dataclass(frozen=True)
class Region:
    """Memory a connector may read and write."""

    start: int
    """The first address."""
    end: int
    """One past the last address."""
    label: str
    """``pool`` (a storage vLLM registered) or ``host buffer N`` (connector-side storage)."""


@dataclass(frozen=True)
class OutOfBounds:
    """One refused copy: its source or destination leaves every known region."""

    side: str
    """``read`` (source) or ``write`` (destination)."""
    address: int
    """Where the refused range starts."""
    nbytes: int
    """Its length."""
    nearest: str
    """The region the range starts in or is nearest to, with the offset, for the report."""

    def line(self) -> str:
        return f"{self.side} of {self.nbytes} bytes at {self.nearest}"


class OutOfBoundsAccess(Exception):
    """Raised into the connector's code when a copy leaves known memory (nothing moved)."""


class CopyEngine:
    """Bounds-checked ``memmove`` over the registered pool and the adapter's host buffers."""

    def __init__(self, pools: Iterable[Any]) -> None:
        """``pools``: the registered tensors (each one's whole storage becomes a region)."""
        self.regions: list[Region] = []
        seen: set[int] = set()
        for t in pools:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                self.regions.append(Region(storage.data_ptr(), storage.data_ptr() + storage.nbytes(), "pool"))
        self._buffers: list[Any] = []
        self.copies: list[tuple[int, int, int]] = []
        """Every copy made, ``(src, dst, nbytes)``, in order."""
        self.out_of_bounds: list[OutOfBounds] = []

    def host_buffer(self, nbytes: int) -> Any:
        """An int8 CPU tensor of ``nbytes`` the connector may copy to and from (its host
        cache, its storage file, the remote peer's memory), zero-filled."""
        import torch

        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"host_buffer({nbytes!r}): expected a non-negative byte count")
        buf = torch.zeros(max(nbytes, 1), dtype=torch.int8)
        self._buffers.append(buf)
        self.regions.append(Region(buf.data_ptr(), buf.data_ptr() + nbytes, f"host buffer {len(self._buffers) - 1}"))
        return buf

    def region_of(self, address: int, nbytes: int) -> Region | None:
        for r in self.regions:
            if r.start <= address and address + nbytes <= r.end:
                return r
        return None

    def _nearest(self, address: int) -> str:
        def distance(r: Region) -> int:
            return 0 if r.start <= address < r.end else min(abs(address - r.start), abs(address - r.end))

        r = min(self.regions, key=distance)
        offset = address - r.start
        return f"{r.label} offset {offset}" + (f" (region is {r.end - r.start} bytes)" if not 0 <= offset < r.end - r.start else "")

    def copy(self, src: int, dst: int, nbytes: int) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` (may overlap, as ``memmove``).

        Raises ``OutOfBoundsAccess`` (and records it) if either range leaves known memory."""
        for label, value in (("src", src), ("dst", dst), ("nbytes", nbytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TypeError(f"copy {label}={value!r}: expected a non-negative integer")
        if len(self.copies) >= MAX_COPIES:
            raise OutOfBoundsAccess(f"more than {MAX_COPIES} copies in one transfer")
        bad = [(side, addr) for side, addr in (("read", src), ("write", dst)) if self.region_of(addr, nbytes) is None]
        if bad:
            for side, addr in bad:
                self.out_of_bounds.append(OutOfBounds(side, addr, nbytes, self._nearest(addr)))
            raise OutOfBoundsAccess("; ".join(o.line() for o in self.out_of_bounds[-len(bad):]))
        self.copies.append((src, dst, nbytes))
        if nbytes:
            ctypes.memmove(dst, src, nbytes)


__all__ = ["MAX_COPIES", "CopyEngine", "OutOfBounds", "OutOfBoundsAccess", "Region"]
