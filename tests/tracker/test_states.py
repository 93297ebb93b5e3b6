"""The prediction state machine, as a table and as a property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracker.states import (
    TERMINAL,
    IllegalTransition,
    Status,
    can_transition,
    check_transition,
    sources_of,
)

ALLOWED = {
    (Status.STARTING, Status.PROCESSING),
    (Status.STARTING, Status.SUCCEEDED),
    (Status.STARTING, Status.FAILED),
    (Status.STARTING, Status.CANCELED),
    (Status.STARTING, Status.ABORTED),
    (Status.PROCESSING, Status.SUCCEEDED),
    (Status.PROCESSING, Status.FAILED),
    (Status.PROCESSING, Status.CANCELED),
}


@pytest.mark.parametrize("current", list(Status))
@pytest.mark.parametrize("target", list(Status))
def test_transition_table(current: Status, target: Status) -> None:
    assert can_transition(current, target) == ((current, target) in ALLOWED)
    if (current, target) in ALLOWED:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_transition(current, target)


def test_terminal_states_have_no_way_out() -> None:
    assert {s for s in Status if s.is_terminal} == TERMINAL
    for state in TERMINAL:
        assert not any(can_transition(state, target) for target in Status)


def test_sources_feed_conditional_updates() -> None:
    assert set(sources_of(Status.SUCCEEDED)) == {"starting", "processing"}
    assert set(sources_of(Status.ABORTED)) == {"starting"}
    assert set(sources_of(Status.PROCESSING)) == {"starting"}


@given(st.lists(st.sampled_from(list(Status)), max_size=12))
def test_any_walk_reaches_at_most_one_terminal_state(steps: list[Status]) -> None:
    current = Status.STARTING
    terminal_seen = 0
    for target in steps:
        if can_transition(current, target):
            current = target
            terminal_seen += target.is_terminal
    assert terminal_seen <= 1
    assert current.is_terminal == (terminal_seen == 1)
