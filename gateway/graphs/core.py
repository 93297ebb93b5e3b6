"""One run of a graph as a sans-IO core: which step starts when, with what input, and how the
run ends. It never awaits, reads a clock or touches a task; :func:`gateway.graphs.run.run_graph`
drives it on :class:`core.shell.Shell` and carries out its effects.

* A step starts as soon as its inputs exist (Triton's ensemble scheduler): the head at
  :class:`Begin`, a child once every parent has succeeded. Its input is ``head_data`` for the
  head, the parent's output for a child of one parent, ``{parent: output, …}`` (parents in
  plan order) for a child of several.
* At most ``max_inflight`` steps run at once; a step whose inputs exist waits in ``ready``
  (first come, first started) until one ends.
* The run ends exactly once, with the first of: every step succeeded (:class:`Answer`: the
  one leaf's output, or ``{leaf: output, …}``); a step raised (:class:`StepFailure`); the
  deadline passed with steps unfinished (:class:`TimedOut`). After that every event is ignored:
  the shell cancels what is still running, and their endings change nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from core.shell import ArmTimer, Tick
from gateway.graphs.plan import GraphPlan

# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    now: float


@dataclass(frozen=True, slots=True)
class StepSucceeded:
    step: str
    output: Any
    now: float


@dataclass(frozen=True, slots=True)
class StepRaised:
    step: str
    error: BaseException


Event = Begin | StepSucceeded | StepRaised | Tick

# -- effects --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunStep:
    step: str
    data: Any


@dataclass(frozen=True, slots=True)
class Answer:
    value: Any


@dataclass(frozen=True, slots=True)
class StepFailure:
    """``step`` raised ``error``; every step still running is to be canceled."""

    step: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The deadline passed: ``running`` are to be canceled; ``waiting`` never started."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]


Effect = ArmTimer | RunStep | Answer | StepFailure | TimedOut


class GraphRun:
    def __init__(
        self, plan: GraphPlan[Any], head_data: Any, deadline: float, max_inflight: int
    ) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be at least 1, not {max_inflight}")
        self.plan = plan
        self.head_data = head_data
        self.deadline = deadline
        self.max_inflight = max_inflight
        #: Parents each node still waits for.
        self.missing = {node: len(plan.parents[node]) for node in plan.order}
        self.outputs: dict[str, Any] = {}
        self.ready: deque[str] = deque()
        #: Steps started and not yet ended, in the order they started.
        self.running: dict[str, None] = {}
        self.over = False

    def handle(self, event: Event) -> list[Effect]:
        if self.over:
            return []
        match event:
            case Begin(now=now):
                self.ready.append(self.plan.head)
                if now >= self.deadline:
                    return self._time_out()
                return [ArmTimer(self.deadline), *self._start_ready()]
            case StepSucceeded(step=step, output=output, now=now):
                return self._succeeded(step, output, now)
            case StepRaised(step=step, error=error):
                del self.running[step]
                self.over = True
                return [StepFailure(step, error)]
            case Tick(now=now):
                return self._time_out() if now >= self.deadline else []
        raise AssertionError(f"unexpected event {event!r}")  # pragma: no cover

    def _succeeded(self, step: str, output: Any, now: float) -> list[Effect]:
        del self.running[step]
        self.outputs[step] = output
        for child in self.plan.children[step]:
            self.missing[child] -= 1
            if self.missing[child] == 0:
                self.ready.append(child)
        if len(self.outputs) == len(self.plan.order):
            self.over = True
            return [Answer(self._answer())]
        if now >= self.deadline:
            return self._time_out()
        return self._start_ready()

    def _start_ready(self) -> list[Effect]:
        effects: list[Effect] = []
        while self.ready and len(self.running) < self.max_inflight:
            step = self.ready.popleft()
            self.running[step] = None
            effects.append(RunStep(step, self._input(step)))
        return effects

    def _input(self, step: str) -> Any:
        parents = self.plan.parents[step]
        if not parents:
            return self.head_data
        if len(parents) == 1:
            return self.outputs[parents[0]]
        return {parent: self.outputs[parent] for parent in parents}

    def _answer(self) -> Any:
        leaves = self.plan.leaves
        if len(leaves) == 1:
            return self.outputs[leaves[0]]
        return {leaf: self.outputs[leaf] for leaf in leaves}

    def _time_out(self) -> list[Effect]:
        self.over = True
        return [TimedOut(tuple(self.running), tuple(self.ready))]
