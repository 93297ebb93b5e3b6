"""Operation tokens: HMAC-signed, nonce-checked permission for one runner lifecycle call.

A ``verifiedOpToken`` authorises one ``model-load``, ``model-unload`` or ``cache-flush`` of one
model, once, within a few minutes of being issued. On the wire it is unpadded base64url of::

    {"opToken": {"operation": "model-load", "modelId": "acme/llm",
                 "issuedAt": 1795316400, "signers": ["alice", "bob"],
                 "nonce": "<32 to 128 lowercase hex digits>"},
     "signature": "<hex HMAC-SHA256 of opToken as JSON, sorted keys, separators (',', ':')>"}

``issuedAt`` is epoch seconds, as the runner API spec writes it and :func:`issue` writes it;
an ISO 8601 string with a time zone (``"2026-11-22T03:00:00Z"``) is accepted too. Conduit adds
one optional claim, ``"runnerId"``: a token naming a runner (its ``runnerId`` in capabilities,
``CONDUIT_RUNNER_ID``) is accepted by that runner only; without it, by any runner holding the key.

:class:`OpTokenVerifier` checks, in this order: parse → signature → time window → operation and
model → runner → signers → nonce. The nonce is recorded only when everything before it passed,
so a token rejected for any other reason cannot burn a nonce. Nonces are recorded in this
process's memory or, with ``CONDUIT_RUNNER_REDIS_URL``, in Redis (keys
``optoken:nonce:<nonce>``), so that replicas behind one address and a restarted runner refuse a
replay too (:mod:`runners.nonces`).

This module does not authenticate *who* signed: ``signers`` are names inside a body that anyone
holding the one shared key can write. ``OP_TOKEN_MIN_SIGNERS`` makes the issuer state an
M-of-N approval and makes that statement tamper-evident; it is not M independent signatures.

Its refusals, :class:`runners.control_errors.OpTokenError` and one subclass per check (each
answered 403 with its own ``code``), are in the one refusal tree.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from protocol.lifecycle import OpTokenClaims, OpTokenEnvelope, wire_names
from protocol.values import Operation
from runners.control_errors import (
    BadSignatureError,
    InsufficientSignersError,
    MalformedOpTokenError,
    ModelMismatchError,
    OperationMismatchError,
    OutsideValidityWindowError,
    ReplayedNonceError,
    RunnerMismatchError,
)
from runners.nonces import MemoryNonceStore, NonceStore

OPERATIONS = frozenset(Operation)
DEFAULT_MAX_SKEW = timedelta(minutes=5)
DEFAULT_NONCE_MARGIN = timedelta(seconds=30)
NONCE_BYTES = 16
"""128 bits from :mod:`secrets`; tokens carrying shorter nonces are malformed."""

_MAX_TOKEN_CHARS = 8192
_NONCE = re.compile(r"[0-9a-f]{32,128}")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_BODY_KEYS = wire_names(OpTokenClaims)
_REQUIRED_BODY_KEYS = wire_names(OpTokenClaims, required=True)
_ENVELOPE_KEYS = wire_names(OpTokenEnvelope)


@dataclass(frozen=True)
class OpToken:
    """The verified body of a token."""

    operation: str
    model_id: str | None
    issued_at: datetime
    signers: tuple[str, ...]
    nonce: str
    runner_id: str | None = None
    """The runner the token is for; None when any runner may accept it."""


def read_key(path: str | Path) -> bytes:
    """The raw bytes of a key file, without one trailing newline; refuses an empty key."""
    key = Path(path).read_bytes()
    key = key[:-2] if key.endswith(b"\r\n") else key.removesuffix(b"\n")
    if not key:
        raise ValueError(f"operation token key file {path} is empty")
    return key


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The signed bytes: JSON with sorted keys, no spaces, non-ASCII escaped."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(key: bytes, body: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical_body(body), hashlib.sha256).hexdigest()


def format_time(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("naive datetime; pass an aware one (UTC)")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_seconds(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError("naive datetime; pass an aware one (UTC)")
    return math.floor(moment.timestamp())


def issue(
    key: bytes,
    operation: str,
    model_id: str | None,
    signers: list[str],
    now: datetime | None = None,
    runner_id: str | None = None,
) -> str:
    """Mint a token for ``operation`` on ``model_id`` (None for model-less calls), for the
    runner ``runner_id`` only when one is given."""
    if operation not in OPERATIONS:
        known = sorted(op.value for op in Operation)
        raise ValueError(f"unknown operation {operation!r}; expected one of {known}")
    claims = OpTokenClaims(
        operation=Operation(operation),
        model_id=model_id,
        issued_at=epoch_seconds(now or datetime.now(UTC)),
        signers=list(signers),
        nonce=secrets.token_hex(NONCE_BYTES),
        **({} if runner_id is None else {"runner_id": runner_id}),
    )
    body = claims.wire()  # without runnerId unless it was given: the spec's shape
    envelope = {"opToken": body, "signature": sign(key, body)}
    raw = json.dumps(envelope, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class OpTokenVerifier:
    """Verifies tokens for one runner (``runner_id``, which tokens naming a runner must name);
    keep one per process so the nonce store is shared."""

    def __init__(
        self,
        key: bytes,
        signers: Iterable[str],
        min_signers: int = 1,
        *,
        runner_id: str | None = None,
        max_skew: timedelta = DEFAULT_MAX_SKEW,
        nonce_margin: timedelta = DEFAULT_NONCE_MARGIN,
        nonce_store: NonceStore | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.signers = frozenset(name for name in signers if name)
        if not key:
            raise ValueError("operation token key is empty")
        if not 1 <= min_signers <= len(self.signers):
            raise ValueError(
                f"min_signers must be between 1 and the {len(self.signers)} configured signers, "
                f"not {min_signers}; otherwise no token could ever be accepted"
            )
        if max_skew <= timedelta(0) or nonce_margin < timedelta(0):
            raise ValueError("max_skew must be positive and nonce_margin not negative")
        self._key = key
        self.runner_id = runner_id
        self.min_signers = min_signers
        self.max_skew = max_skew
        self.nonce_margin = nonce_margin
        self.nonces: NonceStore = MemoryNonceStore() if nonce_store is None else nonce_store
        self._clock = clock or (lambda: datetime.now(UTC))

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        runner_id: str | None = None,
        nonce_store: NonceStore | None = None,
    ) -> OpTokenVerifier:
        """From ``VERIFIED_OP_TOKEN_KEY_PATH``, ``OP_TOKEN_SIGNERS``, ``OP_TOKEN_MIN_SIGNERS``."""
        env = os.environ if environ is None else environ
        path = env.get("VERIFIED_OP_TOKEN_KEY_PATH")
        if not path:
            raise ValueError("VERIFIED_OP_TOKEN_KEY_PATH is not set")
        signers = [name.strip() for name in env.get("OP_TOKEN_SIGNERS", "").split(",")]
        return cls(
            read_key(path),
            signers,
            int(env.get("OP_TOKEN_MIN_SIGNERS") or 1),
            runner_id=runner_id,
            nonce_store=nonce_store,
        )

    async def verify(self, token: str, operation: str, model_id: str | None) -> OpToken:
        """Return the token's body if it authorises ``operation`` on ``model_id`` now.

        Raises an :class:`OpTokenError` subclass naming the first check that failed.
        """
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        op_token, body, signature = _parse(token)
        expected = sign(self._key, body)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise BadSignatureError("operation token signature does not match")
        now = self._clock()
        if abs(now - op_token.issued_at) > self.max_skew:
            raise OutsideValidityWindowError(
                f"operation token issued at {format_time(op_token.issued_at)} is outside "
                f"±{self.max_skew.total_seconds():g}s of {format_time(now)}"
            )
        if op_token.operation != operation:
            raise OperationMismatchError(
                f"operation token is for {op_token.operation}, not {operation}"
            )
        if op_token.model_id != model_id:
            raise ModelMismatchError(
                f"operation token is for model {op_token.model_id!r}, not {model_id!r}"
            )
        if op_token.runner_id is not None and op_token.runner_id != self.runner_id:
            raise RunnerMismatchError(
                f"operation token is for runner {op_token.runner_id!r}, not this one "
                f"({self.runner_id!r})"
            )
        present = len(self.signers.intersection(op_token.signers))
        if present < self.min_signers:
            raise InsufficientSignersError(
                f"operation token has {present} of the {self.min_signers} required signers"
            )
        # A token stays acceptable until issued_at + max_skew; the margin covers clock steps.
        expires_at = op_token.issued_at + self.max_skew + self.nonce_margin
        if not await self.nonces.add(op_token.nonce, expires_at, now):
            raise ReplayedNonceError("operation token nonce was already used")
        return op_token


def _malformed(reason: str) -> NoReturn:
    raise MalformedOpTokenError(f"malformed operation token: {reason}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of duplicate keys while other parsers may keep the first, so a body
    # with duplicates could be read differently from what was signed: refuse it.
    result = dict(pairs)
    if len(result) != len(pairs):
        _malformed("duplicate JSON key")
    return result


def _reject_constant(name: str) -> NoReturn:
    _malformed(f"non-JSON constant {name}")


def _parse(token: str) -> tuple[OpToken, dict[str, Any], str]:
    """Token → (typed body, body as received, signature); no check of authenticity."""
    if len(token) > _MAX_TOKEN_CHARS or not _BASE64URL.fullmatch(token):
        _malformed("not base64url")
    padded = token.rstrip("=")
    padded += "=" * (-len(padded) % 4)
    try:
        raw = base64.urlsafe_b64decode(padded)
        envelope = json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        _malformed("not base64url-encoded JSON")
    if not isinstance(envelope, dict) or envelope.keys() != _ENVELOPE_KEYS:
        _malformed(f"expected exactly the keys {sorted(_ENVELOPE_KEYS)}")
    body, signature = envelope["opToken"], envelope["signature"]
    if not isinstance(body, dict) or not _REQUIRED_BODY_KEYS <= body.keys() <= _BODY_KEYS:
        _malformed(
            f"opToken must have the keys {sorted(_REQUIRED_BODY_KEYS)}, and may have "
            f"{sorted(_BODY_KEYS - _REQUIRED_BODY_KEYS)}, nothing else"
        )
    if not isinstance(signature, str):
        _malformed("signature must be a string")
    return _to_op_token(body), body, signature


def _to_op_token(body: dict[str, Any]) -> OpToken:
    """Check the body's field types and values."""
    operation, model_id = body["operation"], body["modelId"]
    issued_at, signers, nonce = body["issuedAt"], body["signers"], body["nonce"]
    runner_id = body.get("runnerId")
    if operation not in OPERATIONS:
        _malformed(f"unknown operation {operation!r}")
    if model_id is not None and not isinstance(model_id, str):
        _malformed("modelId must be a string or null")
    if not isinstance(signers, list) or not all(isinstance(name, str) for name in signers):
        _malformed("signers must be a list of strings")
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        _malformed("nonce must be 32 to 128 lowercase hex digits")
    if "runnerId" in body and (not isinstance(runner_id, str) or not runner_id):
        _malformed("runnerId must be a non-empty string")
    return OpToken(operation, model_id, _issued_at(issued_at), tuple(signers), nonce, runner_id)


def _issued_at(value: Any) -> datetime:
    """``issuedAt``: epoch seconds, as the runner API spec writes it, or an ISO 8601 string
    with a time zone."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            _malformed("issuedAt is out of range")
    if not isinstance(value, str):
        _malformed("issuedAt must be epoch seconds or an ISO 8601 string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        _malformed("issuedAt is not an ISO 8601 timestamp")
    if moment.tzinfo is None:
        _malformed("issuedAt has no time zone")
    return moment.astimezone(UTC)
