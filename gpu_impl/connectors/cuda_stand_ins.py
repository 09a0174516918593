"""CUDA streams and events for connectors driven on CPU, where every copy is synchronous:
whatever a stream would order has already run, and an event is complete once recorded.

One pair for every adapter (the connectors call different subsets of the CUDA API).
"""

from __future__ import annotations

from typing import Any


class SyncStream:
    """A CUDA stream (``torch.cuda.Stream``): the copies it would order have already run."""

    cuda_stream = 0
    """The raw stream handle (the default stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """``(lowest, highest)`` priority, as CUDA reports them."""
        return 0, -1

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class SyncEvent:
    """A CUDA event (``torch.cuda.Event`` / ``torch.Event``) recorded after synchronous
    copies: always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


__all__ = ["SyncEvent", "SyncStream"]
