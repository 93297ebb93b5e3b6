"""``conduit pool simulate`` on the fixed trace: the figures it prints are pinned, and so are
the relations they are meant to show (warm promotion's tail wait, cost-aware eviction's loads).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit.cli import main
from runners.pool import Policy, QueueMode
from runners.pool.simulate import parse_bytes, read_trace, simulate

TRACE = Path(__file__).resolve().parent.parent / "fixtures" / "pool_trace.jsonl"
GiB = 2**30

# (policy, queue): (loads, evictions, p50 wait, p99 wait), as the simulator printed them
FIGURES = {
    (Policy.LRU, QueueMode.FIFO): (38, 35, 3.2, 66.0),
    (Policy.LRU, QueueMode.WARM): (34, 31, 0.0, 41.0),
    (Policy.COST, QueueMode.FIFO): (36, 33, 2.7, 109.3),
    (Policy.COST, QueueMode.WARM): (30, 27, 0.0, 66.3),
}


@pytest.mark.parametrize(("policy", "mode"), list(FIGURES))
def test_figures_on_the_fixed_trace(policy: Policy, mode: QueueMode) -> None:
    result = simulate(read_trace(TRACE), 24 * GiB, policy, mode)
    loads, evictions, p50, p99 = FIGURES[policy, mode]
    assert result.requests == 191
    assert not result.rejects
    assert (result.loads, result.evictions) == (loads, evictions)
    assert (round(result.wait(0.5), 1), round(result.wait(0.99), 1)) == (p50, p99)


@pytest.mark.parametrize("policy", list(Policy))
def test_warm_promotion_waits_less_than_fifo(policy: Policy) -> None:
    trace = read_trace(TRACE)
    warm = simulate(trace, 24 * GiB, policy, QueueMode.WARM)
    fifo = simulate(trace, 24 * GiB, policy, QueueMode.FIFO)
    assert warm.wait(0.99) < fifo.wait(0.99)
    assert warm.wait(0.5) <= fifo.wait(0.5)


@pytest.mark.parametrize("mode", list(QueueMode))
def test_cost_aware_eviction_loads_less_than_lru(mode: QueueMode) -> None:
    trace = read_trace(TRACE)
    cost = simulate(trace, 24 * GiB, Policy.COST, mode)
    lru = simulate(trace, 24 * GiB, Policy.LRU, mode)
    assert cost.loads < lru.loads


def test_the_command_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    main(["pool", "simulate", "--trace", str(TRACE), "--budget", "24GiB", "--policy", "cost"])
    out = capsys.readouterr().out
    assert "policy cost  queue warm  budget 24GiB" in out
    assert "loads 30  loads/request 0.157  wait p50 0.0s  p99 66.3s  evictions 27" in out


def test_a_trace_without_models_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "trace.jsonl"
    bad.write_text('{"t": 0, "model": "a", "run_s": 1}\n')
    with pytest.raises(SystemExit, match="first line must hold the models"):
        main(["pool", "simulate", "--trace", str(bad)])


@pytest.mark.parametrize(
    ("text", "size"),
    [("24GiB", 24 * GiB), ("512 MiB", 512 * 2**20), ("8GB", 8 * 10**9), (1024, 1024)],
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_bytes(text) == size


def test_a_bad_size_is_refused() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("24 parsecs")
