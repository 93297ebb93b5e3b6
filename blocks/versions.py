"""A block resolved for an account to the version it runs now, with that version's validator;
and whether a ready runner serves it.

A deployment block runs its deployment's released version (whoever may use the deployment may
run it, whether or not it sees the model), unless the deployment is withdrawn
(:func:`catalog.lookups.deployment_withdrawn`); a version block runs its version. What the account
may not use is None, exactly as what does not exist (:func:`blocks.blocks.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blocks import blocks
from blocks.blocks import BlockInfo
from catalog.cache import Catalog
from catalog.records import AccountInfo, DeploymentInfo, VersionInfo
from tracker.fleet import FleetView


@dataclass(frozen=True, slots=True)
class BlockVersion:
    block: BlockInfo
    version: VersionInfo
    #: The version's compiled input validator (None: its schema has no ``Input``).
    validator: Any
    #: The deployment, for a deployment block.
    deployment: DeploymentInfo | None = None


async def find_block_version(
    catalog: Catalog, account: AccountInfo, block_id: str
) -> BlockVersion | None:
    """The block and the version it runs, or None when ``account`` may not use it (or it
    does not exist, or what it names is gone)."""
    block = await blocks.resolve(catalog.engine, account, block_id, catalog.grants)
    if block is None:
        return None
    return await version_of(catalog, account, block)


async def version_of(
    catalog: Catalog, account: AccountInfo, block: BlockInfo
) -> BlockVersion | None:
    """The version ``block`` (resolved for ``account`` already) runs now, or None when what it
    names is gone or no longer usable."""
    reading = await catalog.reading()
    if block.deployment is not None:
        owner, _, name = block.deployment.partition("/")
        deployment = await reading.deployment(account, owner, name)
        if deployment is None or deployment.withdrawn:  # its model's owner took it back
            return None
        found = await reading.released_version(deployment)
        if found is None:
            return None
        return BlockVersion(block, found[0], found[1], deployment)
    assert block.version_id is not None
    found = await reading.version(account, block.version_id)
    if found is None:
        return None
    return BlockVersion(block, found[0], found[1])


def served_now(fleet: FleetView, block: BlockInfo, version: VersionInfo) -> bool | None:
    """Whether the fleet registry lists a ready runner for the block; None until the view has
    read the registry once."""
    if fleet.refreshed_at is None:
        return None
    if block.deployment is not None:
        return bool(fleet.runners_for(block.deployment))
    return version.deployed and bool(fleet.runners_serving(version.id))
