"""The prediction state machine as a pure transition table."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    STARTING = "starting"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[Status] = frozenset(
    {Status.SUCCEEDED, Status.FAILED, Status.CANCELED, Status.ABORTED}
)

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.STARTING: frozenset(
        {Status.PROCESSING, Status.SUCCEEDED, Status.FAILED, Status.CANCELED, Status.ABORTED}
    ),
    Status.PROCESSING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELED: frozenset(),
    Status.ABORTED: frozenset(),
}


class IllegalTransition(Exception):
    """Raised when code asks for a status change the table forbids."""

    def __init__(self, current: Status, target: Status) -> None:
        super().__init__(f"illegal prediction transition {current.value} -> {target.value}")
        self.current = current
        self.target = target


def can_transition(current: Status, target: Status) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: Status, target: Status) -> None:
    if not can_transition(current, target):
        raise IllegalTransition(current, target)


def sources_of(target: Status) -> tuple[str, ...]:
    """Statuses a row may be in for ``target`` to be a legal next state (for conditional SQL)."""
    return tuple(s.value for s, targets in TRANSITIONS.items() if target in targets)


#: The one move back, outside ``TRANSITIONS`` (which a live attempt follows): a run lost with
#: its director starts over from ``starting`` (``Lifecycle.rerun``;
#: ``attempt_writes.reset_for_rerun``).
RERUN_FROM = Status.PROCESSING

#: Statuses that still have a transition ahead: the work a queue entry stands for.
UNFINISHED: tuple[str, ...] = tuple(s.value for s in Status if not s.is_terminal)


def sql_list(statuses: tuple[str, ...]) -> str:
    """``('a', 'b')`` for a SQL ``IN``: statement texts are built from this table, never typed."""
    return "(" + ", ".join(f"'{status}'" for status in statuses) + ")"


class Lifecycle:
    """Where one attempt's prediction stands; it moves only along ``TRANSITIONS``.

    Built from the status a claim read (``claimed``), or by name for the two ways an attempt
    starts from a status it did not read: following a run already under way (``resumed``) and
    running a lost run again from scratch (``rerun``).
    """

    __slots__ = ("_status",)

    def __init__(self, status: Status) -> None:
        self._status = status

    @classmethod
    def claimed(cls, status: str) -> Lifecycle:
        return cls(Status(status))

    @classmethod
    def resumed(cls) -> Lifecycle:
        return cls(Status.PROCESSING)

    @classmethod
    def rerun(cls) -> Lifecycle:
        return cls(Status.STARTING)

    @property
    def status(self) -> Status:
        return self._status

    def move(self, target: Status) -> None:
        check_transition(self._status, target)
        self._status = target
