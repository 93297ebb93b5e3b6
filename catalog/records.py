"""What the catalogue holds: accounts, models, versions and deployments as records, and who
may see and change them (:func:`manages`, :func:`sees`).

Models and deployments belong to accounts (``owner`` is an account's name) and are ``public``
or ``private``; an account sees a private one it owns or was granted, and an admin account
every one. Reads are :mod:`catalog.lookups`'; changes go through :mod:`catalog.models`,
:mod:`catalog.versions` and :mod:`catalog.deployments`, by the rules of :mod:`catalog.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from tracker.priority import Priority
from tracker.tables import Account

#: What a grant or a visibility names.
Kind = Literal["model", "deployment"]


class Visibility(StrEnum):
    PUBLIC = "public"
    PRIVATE = "private"


@dataclass(frozen=True, slots=True)
class AccountInfo:
    id: int
    name: str
    active: bool
    webhook_secret: str
    #: ``X-Priority: high`` from it is honoured (else it gets the default).
    may_use_high_priority: bool = False
    #: An operator's account (``GET /v1/fleet``).
    is_admin: bool = False


@dataclass(frozen=True, slots=True)
class Grants:
    """The private models and deployments an account was granted (by id)."""

    models: frozenset[int] = frozenset()
    deployments: frozenset[int] = frozenset()


def manages(account: AccountInfo, owner: str) -> bool:
    """Whether ``account`` may change what ``owner`` owns (models, versions, deployments,
    blocks): its own, and an admin account everyone's."""
    return account.is_admin or account.name == owner


def sees(account: AccountInfo, owner: str, visibility: str, granted: bool) -> bool:
    """Whether ``account`` may read and run a model or deployment of ``owner``: anyone a
    public one; a private one, whoever manages it (:func:`manages`: its owner, an admin) and
    the accounts granted it. ``granted`` is only needed for a private one of another owner.
    What an account may change, it may read."""
    return visibility == Visibility.PUBLIC or manages(account, owner) or granted


@dataclass(frozen=True, slots=True)
class VersionInfo:
    id: str
    model: str  # owner/name
    openapi_schema: dict[str, Any]
    cog_version: str | None
    shards: int
    created_at: datetime
    deployed: bool  # some deployment runs it, so some director reads its streams


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: int
    owner: str
    name: str
    description: str | None
    visibility: str
    latest_version_id: str | None
    created_at: datetime
    hardware: str | None = None
    github_url: str | None = None
    paper_url: str | None = None
    license_url: str | None = None
    cover_image_url: str | None = None


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    id: int
    owner: str
    name: str
    model: str
    version_id: str
    release_number: int
    shards: int
    prediction_timeout: float
    created_at: datetime
    priority: str = Priority.NORMAL
    visibility: str = Visibility.PRIVATE
    #: ``X-Priority: high`` on it is honoured for every account that may run it.
    allow_high_priority: bool = False
    #: A fleet hardware class, or None (made before deployments named one).
    hardware: str | None = None
    min_instances: int = 1
    max_instances: int = 10
    #: Who made the current release (None: the operator's CLI), and when.
    released_by: str | None = None
    released_at: datetime | None = None
    #: Its model's owner took the model back (:func:`catalog.lookups.deployment_withdrawn`):
    #: it runs nothing.
    withdrawn: bool = False

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    @property
    def withdrawal(self) -> str | None:
        """Why it takes no predictions, when it is withdrawn (else None)."""
        if not self.withdrawn:
            return None
        return (
            f"Deployment {self.full_name} runs {self.model}:{self.version_id}, which the"
            f" model's owner withdrew (the model is no longer visible to {self.owner}, or the"
            " version was deleted): it takes no predictions"
        )


#: An :class:`AccountInfo`'s columns, in its order.
ACCOUNT_COLUMNS = (
    Account.id,
    Account.name,
    Account.active,
    Account.webhook_secret,
    Account.may_use_high_priority,
    Account.is_admin,
)
