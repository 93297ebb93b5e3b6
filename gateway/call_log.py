"""What the request log (:mod:`gateway.request_log`) keeps of one ``infer`` call.

Each call gets a time-ordered request id (UUIDv7), also set as :data:`CURRENT_REQUEST` while it
runs: a call it makes to another cluster's gateway (:mod:`gateway.peers`) carries it as
``x-conduit-parent-request``, which that gateway logs as the entry's ``graph_parent``, with the
calling cluster and account as its ``origin``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from gateway.proto.inference_pb2 import BlockInferencePacket
from tracker.request_log import LogEntry

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


def _metadata(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in metadata or () if isinstance(v, str)}


def log_entry(
    call: LoggedCall,
    packet: BlockInferencePacket,
    metadata: Iterable[tuple[str, Any]] | None,
    status: tuple[grpc.StatusCode, str | None],
    max_data_bytes: int,
) -> LogEntry:
    given = _metadata(metadata)
    origin = None
    if ORIGIN_CLUSTER in given:
        origin = f"{given.get(ORIGIN_ACCOUNT, '')}@{given[ORIGIN_CLUSTER]}"
    parent = None
    if PARENT_REQUEST in given:
        try:
            parent = uuid.UUID(given[PARENT_REQUEST])
        except ValueError:
            parent = None
    data = packet.data.encode()
    code, message = status
    return LogEntry(
        request_id=call.request_id,
        session_id=packet.session_id,
        block_id=packet.block_id,
        seq_no=packet.seq_no,
        ts=datetime.fromtimestamp(call.ts, UTC),
        frame_ptr=packet.frame_ptr,
        data=data if len(data) <= max_data_bytes else b"",
        query_parameters=packet.query_parameters.encode(),
        output_ptr=packet.output_ptr.encode(),
        status=code.name,
        error=message if code != grpc.StatusCode.OK else None,
        latency_ms=(time.monotonic() - call.started) * 1000,
        account_id=call.account_id,
        origin=origin,
        graph_parent=parent,
    )
