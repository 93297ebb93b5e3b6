"""The rules every change of the catalogue follows, whoever asks: the principal, the names and
values allowed, and the refusals.

A change is made *by a principal*: the account that asks over the API, or :data:`OPERATOR`
for ``conduit admin``. A principal manages what its own name owns; an admin principal (an
admin account, the operator) what every account owns (:func:`catalog.records.manages`). The
same name, hardware, instance and version rules hold for both, so what the API refuses the CLI
refuses too, in the same words.

The writes raise :class:`NotOwner` for a thing the principal may see but not change,
:class:`InUse` for a change that must wait, :class:`Refused` for a value at fault and
:class:`LookupError` for a name that is gone.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from catalog.records import AccountInfo

#: ``conduit admin``: an admin principal with no account of its own (a release it makes is
#: ``released_by`` None).
OPERATOR = AccountInfo(id=0, name="", active=True, webhook_secret="", is_admin=True)

#: A new model's or deployment's name: it becomes part of Redis keys and URLs.
NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,98}[a-z0-9])?")
#: Directors the Kubernetes kit may run for one deployment.
MAX_INSTANCES = 1000
#: A new deployment's instances when none are given (the table's defaults).
DEFAULT_MIN_INSTANCES = 1
DEFAULT_MAX_INSTANCES = 10


@dataclass
class Refused(Exception):
    """A value at fault (422), naming its field."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class NoSuchVersion(Refused, LookupError):
    """A version the model does not have: a value at fault to the API (422), a name that does
    not exist to the operator."""


class InUse(Exception):
    """A delete (or change) that must wait for something still using it (409)."""


class NotOwner(Exception):
    """Seen but not the principal's to change (403)."""


def released_by(principal: AccountInfo) -> str | None:
    """Who a release names: the account, or None for the operator."""
    return principal.name or None


def check_name(field_name: str, name: str) -> None:
    if not NAME.fullmatch(name):
        raise Refused(
            field_name,
            "must be 1-100 lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit",
        )


def check_hardware(hardware: str, known: Collection[str]) -> None:
    """``hardware`` must be a class the fleet has (``GET /v1/hardware``, ``known``)."""
    if hardware in known:
        return
    have = ", ".join(sorted(known)) if known else "none yet: start a runner first"
    raise Refused("hardware", f"{hardware!r} is not a hardware class of the fleet ({have})")


def check_instances(low: int, high: int) -> None:
    if low < 0:
        raise Refused("min_instances", "must be 0 or more")
    if high < 1 or high > MAX_INSTANCES:
        raise Refused("max_instances", f"must be between 1 and {MAX_INSTANCES}")
    if low > high:
        raise Refused("min_instances", f"must not exceed max_instances ({high})")
