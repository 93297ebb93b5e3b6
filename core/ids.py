"""Prediction ids: 26 lowercase base32 characters, like Replicate's; the gateway's request ids:
time-ordered UUIDs (v7)."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import time
import uuid


def new_prediction_id() -> str:
    return base64.b32encode(os.urandom(16)).decode().rstrip("=").lower()


def new_api_token() -> str:
    return "r8_" + secrets.token_urlsafe(30)


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_request_id(now_ms: int | None = None) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits, so that ids sort
    by time and an id tells when it was drawn (:func:`request_id_time`)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | int.from_bytes(os.urandom(10)) & ((1 << 80) - 1)
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # the RFC's variant
    return uuid.UUID(int=value)


def request_id_time(request_id: uuid.UUID) -> float | None:
    """The Unix time a UUIDv7 was drawn at; None for another version."""
    if request_id.version != 7:
        return None
    return (request_id.int >> 80) / 1000
