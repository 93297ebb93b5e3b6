"""What an operator types: ``OWNER/NAME``, account lists, visibilities."""

from __future__ import annotations

import sys

from catalog import records

VISIBILITIES = ["public", "private"]


def split_name(value: str) -> tuple[str, str]:
    owner, sep, name = value.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise SystemExit(f"expected OWNER/NAME, got {value!r}")
    return owner, name


def visibility(value: str | None) -> records.Visibility | None:
    if value is None:
        return None
    try:
        return records.Visibility(value)
    except ValueError:
        allowed = ", ".join(records.Visibility)
        raise SystemExit(f"visibility must be one of {allowed}, got {value!r}") from None


def account_names(value: str, required: bool = False) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if required and not names:
        raise SystemExit("expected ACCOUNT[,ACCOUNT...]")
    return names


def note_new_owner(owner: str) -> None:
    print(
        f"created account {owner} to own it (no token: `conduit admin create-account {owner}`"
        " gives it one)",
        file=sys.stderr,
    )
