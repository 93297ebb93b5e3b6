"""How the director is put together: prediction rows only through the tracker's ledger and
attempt trackers, and metrics that belong to a process rather than to a module."""

from __future__ import annotations

import ast
from pathlib import Path

from director.metrics import DirectorMetrics

DIRECTOR = Path(__file__).resolve().parents[2] / "director"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.name, ast.parse(path.read_text())) for path in sorted(DIRECTOR.glob("*.py"))]


def _imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_director_modules_reach_prediction_rows_only_through_the_tracker() -> None:
    reaching = {
        name: sorted(
            i
            for i in _imports(tree)
            for rows in ("tracker.store", "tracker.attempt_writes")
            if i == rows or i.startswith(f"{rows}.")
        )
        for name, tree in _modules()
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_no_director_module_holds_a_metrics_registry() -> None:
    held = []
    for name, tree in _modules():
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            call = node.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                if call.func.id in {"CollectorRegistry", "Counter", "Gauge", "Histogram"}:
                    held.append(f"{name}:{node.lineno}")
    assert held == []


def test_each_director_process_counts_in_its_own_registry() -> None:
    first, second = DirectorMetrics(), DirectorMetrics()
    first.dead_lettered.inc()
    first.runner_refusals.labels("busy").inc(2)
    assert b"conduit_director_dead_lettered_total 1.0" in first.exposition()
    assert b'conduit_director_runner_refusals_total{reason="busy"} 2.0' in first.exposition()
    assert b"conduit_director_dead_lettered_total 0.0" in second.exposition()
    assert b'reason="busy"' not in second.exposition()
