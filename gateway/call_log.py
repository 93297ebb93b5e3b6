"""What the request log (:mod:`gateway.request_log`) keeps of one ``infer`` call.

Each call gets a time-ordered request id (UUIDv7), also set as :data:`CURRENT_REQUEST` while it
runs: a call it makes to another cluster's gateway (:mod:`gateway.peers`) carries it as
``x-conduit-parent-request``, which that gateway logs as the entry's ``graph_parent``, with the
calling cluster and account as its ``origin``.

Only a configured peer carries that metadata: a call whose account is one of
``peer_accounts`` (the accounts other clusters' gateways call this one as, their
``peer_token``). From any other caller the ``x-conduit-origin-*`` and
``x-conduit-parent-request`` keys are ignored: its entry has no origin and no graph parent.

An entry is bounded field by field (:func:`blocks.request_log.bounded_text`,
:func:`~blocks.request_log.bounded_payload`: payloads at most ``log_max_data_bytes`` each);
an unauthenticated call's entry keeps no payload at all, only what names the call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from blocks.request_log import (
    ERROR_CHARS,
    KEY_CHARS,
    LogEntry,
    bounded_payload,
    bounded_text,
)
from catalog.records import AccountInfo
from gateway.proto.inference_pb2 import BlockInferencePacket

#: The request id of the ``infer`` call running in this context (None outside one).
CURRENT_REQUEST: ContextVar[uuid.UUID | None] = ContextVar("conduit_request", default=None)
PARENT_REQUEST = "x-conduit-parent-request"
ORIGIN_ACCOUNT = "x-conduit-origin-account"
ORIGIN_CLUSTER = "x-conduit-origin-cluster"


@dataclass(slots=True)
class LoggedCall:
    request_id: uuid.UUID
    #: When it came (Unix time), and its start on the monotonic clock.
    ts: float
    started: float
    #: Set once the call's token names an account.
    account_id: int | None = None
    #: Whether that account is a configured peer (another cluster's gateway).
    peer: bool = False

    def identify(self, account: AccountInfo, peer_accounts: Collection[str]) -> None:
        """The call is ``account``'s; a peer's when its name is one of ``peer_accounts``."""
        self.account_id = account.id
        self.peer = account.name in peer_accounts


def _metadata(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in metadata or () if isinstance(v, str)}


def log_entry(
    call: LoggedCall,
    packet: BlockInferencePacket,
    metadata: Iterable[tuple[str, Any]] | None,
    status: tuple[grpc.StatusCode, str | None],
    max_data_bytes: int,
) -> LogEntry:
    origin, parent = _origin(_metadata(metadata)) if call.peer else (None, None)
    # An unauthenticated call's payload is a stranger's bytes: none of it is kept.
    limit = max_data_bytes if call.account_id is not None else -1
    code, message = status
    return LogEntry(
        request_id=call.request_id,
        session_id=bounded_text(packet.session_id, KEY_CHARS),
        block_id=bounded_text(packet.block_id, KEY_CHARS),
        seq_no=packet.seq_no,
        ts=datetime.fromtimestamp(call.ts, UTC),
        frame_ptr=bounded_payload(packet.frame_ptr, limit),
        data=bounded_payload(packet.data.encode(), limit),
        query_parameters=bounded_payload(packet.query_parameters.encode(), limit),
        output_ptr=bounded_payload(packet.output_ptr.encode(), limit),
        status=code.name,
        error=None
        if code == grpc.StatusCode.OK or message is None
        else bounded_text(message, ERROR_CHARS),
        latency_ms=(time.monotonic() - call.started) * 1000,
        account_id=call.account_id,
        origin=origin,
        graph_parent=parent,
    )


def _origin(given: dict[str, str]) -> tuple[str | None, uuid.UUID | None]:
    """The ``origin`` and ``graph_parent`` a peer's call names."""
    origin = None
    if ORIGIN_CLUSTER in given:
        origin = f"{given.get(ORIGIN_ACCOUNT, '')}@{given[ORIGIN_CLUSTER]}"
        origin = bounded_text(origin, KEY_CHARS)
    try:
        parent = uuid.UUID(given[PARENT_REQUEST]) if PARENT_REQUEST in given else None
    except ValueError:
        parent = None
    return origin, parent
