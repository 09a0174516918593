"""Which backend x layout x spec kind x dtype cells a test run exercised, and how often.

The pytest plugin records each case a test ran once per test (a cell counts a (test, case)
with a layer in it, not its layers); xdist workers ship their counts to the controller,
which prints one table. Plain data and no heavy imports: usable from the plugin at any time.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterable, Mapping

Cell = tuple[str, str, str, str]
"""(backend, layout, kind, dtype)."""

CELL_FIELDS = ("backend", "layout", "kind", "dtype")
AUTO_LAYOUT = "auto"


def case_cells(case: Any) -> set[Cell]:
    """The cells one ``CaseConfig`` touches (each once)."""
    layout = case.layout or AUTO_LAYOUT
    cells: set[Cell] = set()
    for layer in case.layers:
        dtype = layer.cache_dtype if layer.cache_dtype != "auto" else case.model_dtype
        cells.add((layer.backend, layout, layer.kind, dtype))
    return cells


def parallel_key(case: Any) -> str:
    """``tp{N}/dcp{M}`` of a case (1/1 for cases without the fields), ``/pcp{K}`` added under PCP."""
    tp = getattr(case, "tensor_parallel_size", 1)
    dcp = getattr(case, "decode_context_parallel_size", 1)
    pcp = getattr(case, "prefill_context_parallel_size", 1)
    return f"tp{tp}/dcp{dcp}" + (f"/pcp{pcp}" if pcp > 1 else "")


def _parallel_order(key: str) -> tuple[int, int, int]:
    tp, _, rest = key.removeprefix("tp").partition("/dcp")
    dcp, _, pcp = rest.partition("/pcp")
    return int(tp), int(dcp), int(pcp or 1)


class Coverage:
    """Counts per cell, plus how many (test, case) runs were recorded."""

    def __init__(self) -> None:
        self.cells: Counter[Cell] = Counter()
        self.parallel: Counter[str] = Counter()
        """Runs per ``tp{N}/dcp{M}`` (one rank of a parallel deployment)."""
        self.runs = 0
        self._seen: set[tuple[str, str]] = set()

    def record(self, case: Any, test: str = "") -> bool:
        """Count ``case`` for ``test``; a second record of the same pair is ignored."""
        key = (test, case.to_json() if hasattr(case, "to_json") else repr(case))
        if key in self._seen:
            return False
        self._seen.add(key)
        self.runs += 1
        self.cells.update(case_cells(case))
        self.parallel[parallel_key(case)] += 1
        return True

    # --- xdist transport ---------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """JSON-able (and execnet-serializable: lists, dicts, str, int only)."""
        return {
            "runs": self.runs,
            "cells": [dict(zip(CELL_FIELDS, cell), count=n) for cell, n in sorted(self.cells.items())],
            "parallel": dict(sorted(self.parallel.items())),
        }

    def merge(self, data: Mapping[str, Any]) -> None:
        """Add another run's ``to_data()`` (a worker's) into this one."""
        self.runs += int(data.get("runs", 0))
        for row in data.get("cells", ()):
            self.cells[tuple(str(row[f]) for f in CELL_FIELDS)] += int(row["count"])  # type: ignore[index]
        for key, n in dict(data.get("parallel", {})).items():
            self.parallel[str(key)] += int(n)

    def __bool__(self) -> bool:
        return self.runs > 0

    # --- output ------------------------------------------------------------------------
    def table(self) -> list[str]:
        """The compact table: rows (backend, kind, dtype), columns layouts, '.' for none."""
        if not self.cells:
            return ["kvconform coverage: no cases recorded"]
        layouts = sorted({c[1] for c in self.cells}, key=lambda l: (l != AUTO_LAYOUT, l))
        rows: dict[tuple[str, str, str], dict[str, int]] = {}
        for (backend, layout, kind, dtype), n in self.cells.items():
            rows.setdefault((backend, kind, dtype), {})[layout] = n
        head = ("backend", "kind", "dtype")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        col = max(5, *(len(l) for l in layouts), *(len(str(n)) for n in self.cells.values()))
        out = [
            f"kvconform coverage: {self.runs} case runs, {len(self.cells)} cells "
            f"(backend x layout x kind x dtype); runs per cell, '.' = none",
            "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  " + "  ".join(l.rjust(col) for l in layouts),
        ]
        for key in sorted(rows):
            counts = rows[key]
            out.append(
                "  ".join(k.ljust(w) for k, w in zip(key, widths))
                + "  "
                + "  ".join(str(counts.get(l, ".")).rjust(col) for l in layouts)
            )
        if self.parallel:
            by_size = sorted(self.parallel.items(), key=lambda kv: _parallel_order(kv[0]))
            out.append("parallel (runs per TP/DCP): " + ", ".join(f"{k} {n}" for k, n in by_size))
        return out

    def to_json(self, **extra: Any) -> str:
        return json.dumps({**extra, **self.to_data()}, indent=2, sort_keys=True)


def from_data(items: Iterable[Mapping[str, Any]]) -> Coverage:
    """One Coverage from several ``to_data()`` payloads."""
    cov = Coverage()
    for data in items:
        cov.merge(data)
    return cov


__all__ = ["AUTO_LAYOUT", "CELL_FIELDS", "Cell", "Coverage", "case_cells", "from_data", "parallel_key"]
