"""``conduit admin``'s parser: each concept's module adds its own subcommands."""

from __future__ import annotations

from typing import Any

from conduit.admin.accounts import add_accounts
from conduit.admin.blocks import add_blocks
from conduit.admin.deployments import add_deployments
from conduit.admin.fleet import add_fleet
from conduit.admin.graphs import add_graphs
from conduit.admin.models import add_models
from conduit.admin.shards import add_shards
from conduit.admin.sharing import add_sharing


def add_admin(sub: Any) -> None:
    """``conduit admin ...``: the subcommands, each with its function as ``func``."""
    admin = sub.add_parser(
        "admin",
        help="manage accounts, models, deployments and who may use them",
        description="Manage accounts, models, deployments, who may use them, blocks and "
        "graphs, in the database at DATABASE_URL (changes announced to every process's "
        "cache over REDIS_URL). Lists take --json; show-* print JSON.",
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    add_accounts(admin_sub)
    add_fleet(admin_sub)
    add_models(admin_sub)
    add_deployments(admin_sub)
    add_sharing(admin_sub)
    add_shards(admin_sub)
    add_blocks(admin_sub)
    add_graphs(admin_sub)
