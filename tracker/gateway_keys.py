"""The inference gateway's Redis keys, built here and nowhere else: a session's keys and a
quota scope's counts (every other key: ``tracker.keys``).

====================================  ===========================================================
``gw:{gs-<acct>-<h>}:answers``        a gateway session's stored answers by ``seq_no`` (hash;
                                      ``<h>`` digests the session id; ``gateway.sessions``)
``gw:{gs-<acct>-<h>}:claim:<seq>``    the task ``seq_no`` of that session is running (token)
``gw:{gs-<acct>-<h>}:inflight``       sorted set of the ``seq_no`` of that session's running tasks
``gw:{gs-<acct>-<h>}:route``          that session's cached resolution (block, graph plan)
``quota:{q-total}:rate``              the gateway's requests of the last second, by bucket
                                      (hash; ``gateway.quota``)
``quota:{q-acct-<id>}:rate``          an account's requests of the last second
``quota:{q-s-<acct>-<h>}:rate``       a session's requests of the last second (``:total``: of
                                      the quota window)
``quota:{q-b-<h>}:rate``              a block's requests of the last second (``:total``: of the
                                      quota window; ``<h>`` digests the block id)
====================================  ===========================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one gateway session (an account's ``session_id``), all of one hash tag."""

    answers: str
    inflight: str
    route: str
    prefix: str

    def claim(self, seq_no: int) -> str:
        return f"{self.prefix}claim:{seq_no}"


def session_keys(account_id: int, session_id: str) -> SessionKeys:
    digest = hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()
    prefix = f"gw:{{gs-{account_id}-{digest}}}:"
    return SessionKeys(prefix + "answers", prefix + "inflight", prefix + "route", prefix)


# --- The gateway's quota (``gateway.quota``) ------------------------------------------------
# One hash tag per scope (the gateway, an account, a session, a block): the limits of one scope
# are checked and counted by one script call on one slot (``tracker.limits.windows``), and a
# Redis Cluster spreads the sessions, blocks and accounts over its nodes.


@dataclass(frozen=True, slots=True)
class QuotaKeys:
    """The counts of one quota scope: its per-second rate, and its total over the window."""

    rate: str
    total: str


def _quota_keys(tag: str) -> QuotaKeys:
    prefix = f"quota:{{{tag}}}:"
    return QuotaKeys(prefix + "rate", prefix + "total")


def quota_total_keys() -> QuotaKeys:
    """Every request the gateway takes (only ``rate`` is used)."""
    return _quota_keys("q-total")


def quota_account_keys(account_id: int) -> QuotaKeys:
    return _quota_keys(f"q-acct-{account_id}")


def quota_session_keys(account_id: int, session_id: str) -> QuotaKeys:
    digest = hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()
    return _quota_keys(f"q-s-{account_id}-{digest}")


def quota_block_keys(block_id: str) -> QuotaKeys:
    digest = hashlib.blake2b(block_id.encode(), digest_size=12).hexdigest()
    return _quota_keys(f"q-b-{digest}")
