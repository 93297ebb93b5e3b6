"""``Prefer`` and the start deadline, as every runner host reads them (runners.prefer)."""

from __future__ import annotations

import pytest

from runners.control_errors import InvalidFieldError
from runners.prefer import deadline, preferences, respond_async


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, {}),
        ("", {}),
        ("respond-async", {"respond-async": ""}),
        ("Respond-Async, wait=5", {"respond-async": "", "wait": "5"}),
        ("wait=5; foo=bar, respond-async", {"wait": "5", "respond-async": ""}),
        ('wait="7"', {"wait": "7"}),
        ("wait=3, wait=9", {"wait": "3"}),  # RFC 7240: the first of a name counts
    ],
)
def test_preferences_are_read_as_rfc_7240_lists(
    header: str | None, expected: dict[str, str]
) -> None:
    assert preferences(header) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("respond-async", True),
        ("respond-async, wait=5", True),
        ("wait=5,RESPOND-ASYNC", True),
        ("wait=5", False),
        ("respond-asynchronously", False),
    ],
)
def test_respond_async_is_one_preference_among_others(header: str, expected: bool) -> None:
    assert respond_async({"Prefer": header}) is expected


def test_the_deadline_header_wins_over_prefer_wait() -> None:
    assert deadline({}) is None
    assert deadline({"Prefer": "respond-async, wait=5"}) == 5.0
    assert deadline({"X-Conduit-Deadline": "2.5", "Prefer": "wait=5"}) == 2.5
    assert deadline({"X-Conduit-Deadline": " ", "Prefer": "wait=5"}) == 5.0


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"X-Conduit-Deadline": "soon"}, "X-Conduit-Deadline"),
        ({"X-Conduit-Deadline": "-1"}, "X-Conduit-Deadline"),
        ({"X-Conduit-Deadline": "inf"}, "X-Conduit-Deadline"),
        ({"Prefer": "wait=abc"}, "Prefer"),
    ],
)
def test_a_deadline_that_is_no_number_of_seconds_is_refused(
    headers: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidFieldError) as refused:
        deadline(headers)
    assert refused.value.field == field
