"""``Idempotency-Key`` on the create endpoints: a retried create gives back the same prediction.

A key belongs to one account and is bound to a fingerprint of the request that first used it:
the resolved destination (version id and deployment), the parsed body as canonical JSON, the
``Cancel-After`` duration and the ``X-Priority`` header (when sent). Reusing the key with the
same fingerprint replays the stored prediction as it is now; with another fingerprint it is
refused (422).

Creates with one key are serialised by a transaction-scoped Postgres advisory lock, taken without
waiting in the transaction that inserts the prediction and the key. A request that finds the
lock held is answered 409 with ``Retry-After`` rather than queued behind it; the lock is gone by
the time the first create commits, so a retry replays. Without the header none of this runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from api.errors import Conflict, InvalidInput, InvalidRequest
from api.protocol import PredictionCreate
from tracker import store
from tracker.store import NewPrediction

HEADER = "Idempotency-Key"
MAX_LENGTH = 255
#: Body fields that do not change which prediction is made.
_IGNORED_FIELDS = {"stream"}


def from_request(
    header: str | None,
    account_id: int,
    *,
    version_id: str,
    deployment: str | None,
    body: PredictionCreate,
    cancel_after: timedelta | None,
    priority: str | None = None,
) -> Idempotency | None:
    """The create's key and fingerprint, or None (and no work) without the header."""
    key = parse_key(header)
    if key is None:
        return None
    request = fingerprint(version_id, deployment, body, cancel_after, priority)
    return Idempotency(account_id, key, request)


def parse_key(value: str | None) -> str | None:
    """The header's key, or None without the header; 400 when empty or too long."""
    if value is None:
        return None
    if not value.strip() or len(value) > MAX_LENGTH:
        raise InvalidRequest(
            f"{HEADER} must be 1 to {MAX_LENGTH} characters",
            errors=[{"field": HEADER, "message": f"must be 1 to {MAX_LENGTH} characters"}],
        )
    return value


def fingerprint(
    version_id: str,
    deployment: str | None,
    body: PredictionCreate,
    cancel_after: timedelta | None,
    priority: str | None = None,
) -> str:
    """sha-256 of everything that defines the prediction a create would make."""
    request: dict[str, Any] = {
        "version_id": version_id,
        "deployment": deployment,
        # Python mode: the parsed body is JSON already, and JSON mode cannot encode a lone
        # surrogate (such a create is refused with 422 afterwards, not a 500 here).
        "body": body.model_dump(exclude=_IGNORED_FIELDS),
        # The parsed duration, so that "90s" and "1m30s" are the same request.
        "cancel_after": cancel_after.total_seconds() if cancel_after is not None else None,
    }
    if priority is not None:  # only when sent: keys stored before it existed still match
        request["priority"] = str(priority)
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a body with a lone surrogate is refused later (422), not here (500).
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Idempotency:
    """An account's key and the fingerprint of the request that carries it."""

    account_id: int
    key: str
    request_sha256: str

    @property
    def lock_id(self) -> int:
        """The advisory lock for this account and key: a signed 64-bit hash (Postgres bigint)."""
        digest = hashlib.sha256(f"{self.account_id}\0{self.key}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    async def insert_once(
        self, conn: AsyncConnection, new: NewPrediction
    ) -> tuple[RowMapping, bool]:
        """Insert ``new`` under this key, or return the prediction the key already names.

        Returns the row and whether it is a replay. Runs inside the caller's transaction, which
        must commit before the prediction is queued; the lock is released with it.
        """
        if not await store.try_xact_lock(conn, self.lock_id):
            raise Conflict(
                f"A request with this {HEADER} is still being processed; retry shortly.",
                errors=[{"field": HEADER, "message": "a request with this key is in progress"}],
                retry_after=1,
            )
        earlier = await store.idempotent_prediction(conn, self.account_id, self.key)
        if earlier is not None:
            if earlier["request_sha256"] != self.request_sha256:
                raise InvalidInput(
                    f"This {HEADER} was already used with a different request",
                    errors=[{"field": HEADER, "message": "key reused with a different request"}],
                )
            return earlier, True
        row = await store.insert_prediction(conn, new)
        await store.insert_idempotency_key(
            conn, self.account_id, self.key, self.request_sha256, new.id
        )
        return row, False
