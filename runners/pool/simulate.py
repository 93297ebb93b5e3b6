"""``conduit pool simulate``: replay a request trace through :class:`PoolCore` on a fake clock.

The trace is JSON lines. The first line describes the models (and optionally pool knobs); every
other line is one request, in any order (they are replayed by time)::

    {"models": [{"name": "llm", "bytes": "14GiB", "load_s": 40, "unload_s": 2,
                 "concurrency": 1, "priority": 0, "keep_alive": 300, "pinned": false}],
     "min_resident": 30}
    {"t": 0.0, "model": "llm", "run_s": 2.5}
    {"t": 1.5, "model": "llm", "run_s": 1.0, "deadline_s": 120, "priority": 1}

``bytes`` is a number or a size with a unit (``GiB``, ``MiB``, ``GB``…); ``deadline_s`` is
relative to ``t``. Loads take ``load_s`` and observe exactly ``bytes``; unloads take
``unload_s`` (default 1). Times are seconds of the fake clock: a day-long trace replays in
milliseconds. Queue wait is arrival to grant, including any load and eviction it waited for.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.shell import ArmTimer, Tick
from runners.pool.config import FixedProbe, ModelSpec, Policy, PoolConfig, QueueMode
from runners.pool.core import PoolCore
from runners.pool.events import (
    Effect,
    Event,
    Grant,
    LoadDone,
    Refuse,
    Request,
    ServeDone,
    Start,
    StartLoad,
    StartUnload,
    UnloadDone,
)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int | float) -> int:
    """``24GiB``, ``512 MiB``, ``8e9`` or a number: bytes."""
    if isinstance(text, int | float):
        return int(text)
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float
    model: str
    run_s: float
    deadline_s: float | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Trace:
    models: tuple[ModelSpec, ...]
    load_s: dict[str, float]
    unload_s: dict[str, float]
    requests: tuple[TraceRequest, ...]
    min_resident: float = 30.0


def _model(entry: dict[str, Any]) -> ModelSpec:
    return ModelSpec(
        name=entry["name"],
        declared_bytes=parse_bytes(entry["bytes"]),
        concurrency=int(entry.get("concurrency", 1)),
        keep_alive=entry.get("keep_alive"),
        pinned=bool(entry.get("pinned", False)),
        priority=int(entry.get("priority", 0)),
        tensor_parallel=int(entry.get("tensor_parallel", 1)),
        load_seconds=float(entry.get("load_s", 0.0)),
    )


def read_trace(path: Path) -> Trace:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or "models" not in lines[0]:
        raise ValueError(f"{path}: the first line must hold the models")
    header, rows = lines[0], lines[1:]
    requests = sorted(
        (
            TraceRequest(
                float(r["t"]),
                r["model"],
                float(r["run_s"]),
                r.get("deadline_s"),
                int(r.get("priority", 0)),
            )
            for r in rows
        ),
        key=lambda r: r.t,
    )
    return Trace(
        models=tuple(_model(m) for m in header["models"]),
        load_s={m["name"]: float(m.get("load_s", 0.0)) for m in header["models"]},
        unload_s={m["name"]: float(m.get("unload_s", 1.0)) for m in header["models"]},
        requests=tuple(requests),
        min_resident=float(header.get("min_resident", 30.0)),
    )


@dataclass(slots=True)
class Result:
    requests: int = 0
    loads: int = 0
    evictions: int = 0
    waits: list[float] = field(default_factory=list)
    rejects: Counter[str] = field(default_factory=Counter)

    @property
    def loads_per_request(self) -> float:
        return self.loads / self.requests if self.requests else 0.0

    def wait(self, quantile: float) -> float:
        """Nearest-rank quantile of the granted requests' queue waits, in seconds."""
        if not self.waits:
            return 0.0
        ordered = sorted(self.waits)
        return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]

    def summary(self) -> str:
        rejects = ", ".join(f"{k}={v}" for k, v in sorted(self.rejects.items())) or "none"
        return (
            f"requests {self.requests}  loads {self.loads}  "
            f"loads/request {self.loads_per_request:.3f}  "
            f"wait p50 {self.wait(0.5):.1f}s  p99 {self.wait(0.99):.1f}s  "
            f"evictions {self.evictions}  rejects {rejects}"
        )


class _Clock:
    """The fake clock: a heap of (time, order, event)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Event]] = []
        self._order = 0

    def at(self, when: float, event: Event) -> None:
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, event))

    def __iter__(self) -> Iterator[Event]:
        while self._heap:
            yield heapq.heappop(self._heap)[2]


def simulate(
    trace: Trace, budget: int, policy: Policy, queue_mode: QueueMode = QueueMode.WARM
) -> Result:
    config = PoolConfig(
        models=trace.models,
        budget_bytes=budget,
        policy=policy,
        queue_mode=queue_mode,
        min_resident=trace.min_resident,
    )
    core = PoolCore(config, FixedProbe((budget,)))
    clock = _Clock()
    runs: dict[str, float] = {}
    clock.at(0.0, Start(0.0))
    for n, r in enumerate(trace.requests):
        deadline = None if r.deadline_s is None else r.t + r.deadline_s
        runs[f"r{n}"] = r.run_s
        clock.at(r.t, Request(f"r{n}", r.model, deadline, r.t, priority=r.priority))
    result = Result(requests=len(trace.requests))
    for event in clock:
        for effect in core.handle(event):
            _carry_out(effect, event.now, trace, runs, clock, result)
    result.loads = sum(core.stats.loads_total.values())
    result.evictions = sum(core.stats.evictions_total.values())
    return result


def _carry_out(
    effect: Effect,
    now: float,
    trace: Trace,
    runs: dict[str, float],
    clock: _Clock,
    result: Result,
) -> None:
    match effect:
        case StartLoad(model=model):
            size = next(m.declared_bytes for m in trace.models if m.name == model)
            clock.at(now + trace.load_s[model], LoadDone(model, size, now + trace.load_s[model]))
        case StartUnload(model=model):
            clock.at(now + trace.unload_s[model], UnloadDone(model, now + trace.unload_s[model]))
        case Grant(request_id=rid, waited_s=waited):
            result.waits.append(waited)
            clock.at(now + runs[rid], ServeDone(rid, now + runs[rid]))
        case Refuse(code=code):
            result.rejects[code.value] += 1
        case ArmTimer(at=at):
            clock.at(at, Tick(at))
        case _:
            pass


def run(trace_path: Path, budget: str, policy: str, queue: str) -> str:
    """The report ``conduit pool simulate`` prints."""
    trace = read_trace(trace_path)
    result = simulate(trace, parse_bytes(budget), Policy(policy), QueueMode(queue))
    return f"policy {policy}  queue {queue}  budget {budget}\n{result.summary()}"
