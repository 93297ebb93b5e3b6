"""The fault drills' figures and the table printed after the run.

Each drill's :class:`Outcome` is kept in :data:`RESULTS` by the process that ran it. Under
pytest-xdist that is a worker: the worker hands its outcomes to the controller when it ends
(``workeroutput``), and the controller prints one table for the whole run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import pytest

#: The key a worker's outcomes travel under.
WORKER_KEY = "fault_drills"


@dataclass
class Outcome:
    scenario: str
    submitted: int
    terminal: int
    lost: int
    duplicates: int
    explained: int
    seconds: float
    statuses: Counter[str]
    note: str = ""


RESULTS: list[Outcome] = []


def hand_over(config: pytest.Config) -> None:
    """On a worker, give this process's outcomes to the controller (plain types only)."""
    output: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if output is not None:
        output[WORKER_KEY] = [{**asdict(r), "statuses": dict(r.statuses)} for r in RESULTS]


def take_over(output: dict[str, Any]) -> None:
    """On the controller, keep a finished worker's outcomes."""
    for raw in output.get(WORKER_KEY, ()):
        RESULTS.append(Outcome(**{**raw, "statuses": Counter(raw["statuses"])}))


def write_table(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write("fault drills: submitted / terminal / lost / duplicate runs (explained) / seconds")
    for r in sorted(RESULTS, key=lambda r: r.scenario):
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items()))
        write(
            f"  {r.scenario:<44} {r.submitted:>4} {r.terminal:>4} {r.lost:>3} "
            f"{r.duplicates:>3} ({r.explained}) {r.seconds:>6}s  [{statuses}] {r.note}"
        )
