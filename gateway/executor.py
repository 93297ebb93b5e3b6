"""What runs a task: the :class:`Executor` protocol the ``infer`` handler hands tasks to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from catalog.records import AccountInfo
from gateway.task import Task


class OutputFile(NamedTuple):
    """A file of the answer: its metadata (a JSON object) and its bytes."""

    metadata: dict[str, Any]
    data: bytes


@dataclass(frozen=True, slots=True)
class TaskResult:
    #: The answer's ``data``: any JSON value (sent serialised).
    data: Any
    files: list[OutputFile] = field(default_factory=list)


class Executor(Protocol):
    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        """Run ``task`` for ``account``. ``deadline`` is the ``time.monotonic()`` instant by
        which the answer is due (None: no limit); past it, raise
        :class:`gateway.errors.DeadlineExceeded`. Refusals are :mod:`gateway.errors` errors."""
        ...

    def stream(
        self, account: AccountInfo, task: Task, deadline: float | None
    ) -> AsyncIterator[Any]:
        """Run ``task`` as :meth:`run` does, yielding its output as the model produces it:
        each new item of an iterator output (Cog's ``Iterator``/``ConcatenateIterator``), in
        order; a model whose output is a single value yields that value once. Ends when the
        task does; refusals and failures are raised as :meth:`run` raises them."""
        ...
