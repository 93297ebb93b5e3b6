"""Statistics and plain-text tables shared by the benchmarks.

A benchmark repeats each measurement; :class:`Repeated` holds one figure's values across
repeats and renders them as ``median (min–max)``. :func:`table` lays out rows of such cells.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime


def quantile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    if not samples:
        return float("nan")
    if len(samples) == 1:
        return samples[0]
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Repeated:
    """One figure measured once per repeat."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def cell(self, digits: int = 1) -> str:
        if not self.values:
            return "-"
        low, high = min(self.values), max(self.values)
        return f"{self.median:,.{digits}f} ({low:,.{digits}f}–{high:,.{digits}f})"


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}×" if baseline else "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown-compatible table, first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        rest = (f"{cell:>{width}}" for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "| " + " | ".join([first, *rest]) + " |"

    rule = (
        "|"
        + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths))
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def machine() -> str:
    """When and where: date, core count, kernel, Python, and a note on shared load."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"load average at the end {load} (shared machine: expect noise)"
    )
