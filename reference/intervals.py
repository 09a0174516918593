"""Byte intervals ``[start, stop)``: the one helper every byte-range comparison uses.

The reference's regions (``reference.views``) enumerate their runs; connectors' descriptors
and the engine's recorded K/V addresses are runs too. Merging and subtracting them is
done here, once.
"""

from __future__ import annotations

from typing import Iterable, Sequence

Interval = tuple[int, int]


def merge(intervals: Iterable[Sequence[int]]) -> list[Interval]:
    """Sorted ``[start, stop)`` intervals with overlapping and touching ones joined
    (empty ones dropped)."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    """``xs - ys`` for merged interval lists."""
    out = []
    j = 0
    for a, b in xs:
        cur = a
        while j < len(ys) and ys[j][1] <= cur:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def total(intervals: Iterable[Interval]) -> int:
    """Bytes covered by merged intervals."""
    return sum(b - a for a, b in intervals)


__all__ = ["Interval", "merge", "subtract", "total"]
