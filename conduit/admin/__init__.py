"""``conduit admin``: accounts, models (read from a runner), deployments, who may use them,
blocks, the fleet of runners and op tokens; one module per concept, each holding what its
commands do and the parser that names them.

Models and deployments belong to the account their owner names; creating one for an owner
that has no account creates that account (without a token: ``create-account`` reuses it by
name and gives it one). Models are public unless made private, deployments private unless
made public; ``grant`` lets other accounts use a private one. A block publishes a deployment
(or a model version) for the inference gateway, as its owner's.
"""

from conduit.admin.accounts import create_account, set_admin, set_ops_role
from conduit.admin.blocks import (
    create_block,
    delete_block,
    parse_metadata,
)
from conduit.admin.deployments import create_deployment
from conduit.admin.fleet import fleet, format_fleet
from conduit.admin.models import create_model, read_runner_schema
from conduit.admin.names import split_name
from conduit.admin.sharing import entitle_priority, grant, revoke, set_visibility

__all__ = [
    "create_account",
    "create_block",
    "create_deployment",
    "create_model",
    "delete_block",
    "entitle_priority",
    "fleet",
    "format_fleet",
    "grant",
    "parse_metadata",
    "read_runner_schema",
    "revoke",
    "set_admin",
    "set_ops_role",
    "set_visibility",
    "split_name",
]
