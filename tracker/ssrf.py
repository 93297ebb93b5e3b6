"""The SSRF guard, re-exported from :mod:`runners.ssrf` where it lives.

Runners send webhooks too and import nothing of the rest of Conduit, so the one guard sits with
them; the api and the tracker's webhook senders keep importing it from here.
"""

from __future__ import annotations

from runners.ssrf import (
    BlockedAddress,
    GuardedResolver,
    IPAddress,
    Network,
    RefusedEndpoints,
    check_webhook_url,
    is_blocked,
    literal_address,
    parse_cidrs,
    protocol_route,
    url_endpoint,
)

__all__ = [
    "BlockedAddress",
    "GuardedResolver",
    "IPAddress",
    "Network",
    "RefusedEndpoints",
    "check_webhook_url",
    "is_blocked",
    "literal_address",
    "parse_cidrs",
    "protocol_route",
    "url_endpoint",
]
