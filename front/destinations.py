"""Where a request goes: one :class:`Destination` and one resolution for every entry.

A destination is the version a prediction runs, that version's input validator, the stream it
is queued on, and what it is recorded under (the deployment, the block). It is resolved from a
version (a 64-hex id, ``owner/name:id``), a model (its latest version), a deployment (its
released version) or a block (what the block publishes, for the account). What the account may
not see is answered exactly as what does not exist: :class:`UnknownDestination`, naming the
field when the name came in the request's body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from blocks.blocks import BlockInfo
from blocks.versions import version_of
from catalog.cache import Catalog, CatalogReading
from catalog.records import AccountInfo, VersionInfo
from tracker.input_checks import text_problem
from tracker.keys import Target

VERSION_ID = re.compile(r"^[0-9a-f]{64}$")
QUALIFIED_VERSION = re.compile(r"^(?P<owner>[^/\s]+)/(?P<name>[^/:\s]+):(?P<id>[0-9a-f]{64})$")
MODEL_NAME = re.compile(r"^(?P<owner>[^/\s:]+)/(?P<name>[^/\s:]+)$")


@dataclass(frozen=True, slots=True)
class Destination:
    """What a request resolved to."""

    version: VersionInfo
    #: The version's compiled input validator (None: its schema has no ``Input``).
    validator: Any
    target: Target
    deployment_id: int | None = None
    deployment: str | None = None
    #: The deployment honours ``X-Priority: high`` from anyone who may run it.
    allow_high_priority: bool = False
    #: A training (``Target.training``): the model its new version goes to.
    trains_into: str | None = None
    #: The block the request named (a gateway task), if any.
    block: BlockInfo | None = None

    @property
    def synchronous(self) -> bool:
        """The block is marked to run through the synchronous lane."""
        return self.block is not None and self.block.synchronous


class UnknownDestination(Exception):
    """Nothing the account may use goes by that name. ``field``: the request's field that named
    it (None: the path did); ``reason``: the short form for that field's error."""

    def __init__(self, detail: str, field: str | None = None, reason: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.reason = reason or detail


class InvalidName(Exception):
    """A name that cannot be read (not a version id, nor ``owner/name``), or text that cannot
    be stored; ``field`` names where it came."""

    def __init__(self, detail: str, field: str, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.reason = reason


def check_text(field: str, value: str) -> None:
    """Refuse a text field Postgres cannot store or a response cannot carry."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidName(f"{field}: {problem}", field, problem)


class Resolver:
    """Resolution through a process's :class:`~catalog.cache.Catalog` (cached reads)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def version_field(self, account: AccountInfo, version: str | None) -> Destination:
        """``version`` in a create's body: a 64-hex id, ``owner/name:id`` or ``owner/name``."""
        if not version:
            raise InvalidName("version is required", "version", "Field required")
        check_text("version", version)
        qualified = QUALIFIED_VERSION.match(version)
        if qualified:
            return await self._version(
                account, qualified["id"], qualified["owner"], qualified["name"]
            )
        if VERSION_ID.match(version):
            return await self._version(account, version, None, None)
        named = MODEL_NAME.match(version)
        if named:
            return await self.model(account, named["owner"], named["name"], field="version")
        raise InvalidName(
            "version must be a 64-character version id, owner/name:version_id or owner/name",
            "version",
            "not a version id",
        )

    async def _version(
        self,
        account: AccountInfo,
        version_id: str,
        owner: str | None,
        name: str | None,
        reading: CatalogReading | None = None,
    ) -> Destination:
        # A version of a model the account may not see does not exist for it: same answer.
        found = await (reading or await self.catalog.reading()).version(account, version_id)
        if found is None or (owner is not None and found[0].model != f"{owner}/{name}"):
            raise UnknownDestination(
                f"Version {version_id} does not exist", "version", "unknown version"
            )
        info, validator = found
        if not info.deployed:
            raise UnknownDestination(
                f"Version {version_id} of {info.model} is not run by any deployment",
                "version",
                "no deployment runs this version",
            )
        return Destination(info, validator, Target.version(info.id, info.shards))

    async def model(
        self, account: AccountInfo, owner: str, name: str, field: str | None = None
    ) -> Destination:
        """The model's latest version."""
        reading = await self.catalog.reading()
        model = await reading.model(account, owner, name)
        if model is None or model.latest_version_id is None:
            message = f"Model {owner}/{name} does not exist or has no versions"
            raise UnknownDestination(message, field, "unknown model")
        return await self._version(account, model.latest_version_id, None, None, reading)

    async def deployment(self, account: AccountInfo, owner: str, name: str) -> Destination:
        """The deployment's released version, queued on the deployment's streams."""
        reading = await self.catalog.reading()
        deployment = await reading.deployment(account, owner, name)
        if deployment is None:
            raise UnknownDestination(f"Deployment {owner}/{name} does not exist")
        if deployment.withdrawal is not None:
            raise UnknownDestination(deployment.withdrawal)
        found = await reading.released_version(deployment)
        if found is None:
            raise UnknownDestination(
                f"Deployment {owner}/{name} runs a version that no longer exists"
            )
        info, validator = found
        return Destination(
            info,
            validator,
            Target.deployment(deployment.full_name, deployment.shards),
            deployment_id=deployment.id,
            deployment=deployment.full_name,
            allow_high_priority=deployment.allow_high_priority,
        )

    async def block(self, account: AccountInfo, block: BlockInfo) -> Destination | None:
        """What ``block`` (resolved for ``account`` already) runs now: its deployment's
        released version or its version; None when that is gone or no longer usable."""
        found = await version_of(self.catalog, account, block)
        if found is None:
            return None
        if found.deployment is not None:
            deployment = found.deployment
            return Destination(
                found.version,
                found.validator,
                Target.deployment(deployment.full_name, deployment.shards),
                deployment_id=block.deployment_id,
                deployment=block.deployment,
                allow_high_priority=deployment.allow_high_priority,
                block=block,
            )
        target = Target.version(found.version.id, found.version.shards)
        return Destination(
            found.version,
            found.validator,
            target,
            deployment_id=block.deployment_id,
            deployment=block.deployment,
            block=block,
        )
