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
