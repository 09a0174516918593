"""A stop signal (SIGTERM, SIGINT) that cannot be lost.

The CLI's handler raises ``KeyboardInterrupt`` where the main thread is, and also records
the signal here. A ``KeyboardInterrupt`` raised while Python runs a ``__del__`` or a
garbage-collection callback (vLLM and torch objects are collected all the time during a
run) is printed and *ignored*; long loops therefore also call ``raise_if_requested`` between
items, so a stopped run always ends after the item in flight.
"""

from __future__ import annotations

_requested: list[int] = []


def request(signum: int) -> None:
    """Record that a stop signal arrived (called by the signal handler)."""
    _requested.append(signum)


def raise_if_requested() -> None:
    """Raise ``KeyboardInterrupt`` if a stop signal arrived and was not acted on yet."""
    if _requested:
        raise KeyboardInterrupt(f"signal {_requested[-1]}")


__all__ = ["raise_if_requested", "request"]
