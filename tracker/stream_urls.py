"""Capability URLs for prediction streams: ``urls.stream`` opens without a bearer token.

A browser's ``EventSource`` (and the official JavaScript client, which follows it) cannot send
an ``Authorization`` header, so the stream URL a prediction carries is its own credential:
``/v1/predictions/<id>/stream?exp=<unix seconds>&sig=<HMAC-SHA256 of (id, exp)>``. It names
one prediction and expires; it grants reading that prediction's events and nothing else.

Every api replica and director must sign and verify with one key. ``CONDUIT_STREAM_SIGNING_KEY``
sets it; unset, the first process to start makes a random one in Redis (``SET NX``) and every
process reads that one, so replicas agree with no configuration. A verifier that meets a
signature its keys refuse re-reads the shared key (at most every ``RELOAD_INTERVAL`` seconds)
and keeps the keys it knew: should Redis lose its data and a process create a new key, links
signed under either key keep working in the processes that saw both.

Pure signing and checking (:class:`StreamSigner`) are apart from where the key comes from
(:class:`StreamUrlSettings`, :func:`shared_key`).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import Redis

from core.transient import TRANSIENT, persistently
from tracker import keys

log = logging.getLogger(__name__)

#: Seconds a stream URL stays valid by default: a prediction's whole life and its replay.
DEFAULT_TTL = 24 * 3600
#: Fewest characters of a configured key: a placeholder or a short word is refused.
MIN_KEY_LENGTH = 32
#: Least seconds between two re-reads of the shared key prompted by refused signatures.
RELOAD_INTERVAL = 5.0
#: Keys a verifier keeps (the newest signs); older ones are forgotten.
MAX_KEYS = 4

_SIG = re.compile(r"[A-Za-z0-9_-]{43}")
_EXP = re.compile(r"[0-9]{1,12}")


class Signature(enum.Enum):
    """What a stream URL's ``exp`` and ``sig`` are worth for one prediction."""

    VALID = "valid"
    #: Not signed by any key this process knows, for this prediction and this expiry.
    FORGED = "forged"
    #: Genuinely signed, and past its expiry.
    EXPIRED = "expired"


def _signature(key: bytes, subject: str, exp: int, purpose: str = "stream") -> str:
    # The subject is length-prefixed: no choice of subject and expiry can spell another pair's
    # message; the purpose keeps a signature made for one use from being valid for another.
    message = f"{purpose}\n{len(subject)}:{subject}\n{exp}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class StreamSigner:
    """Signs and checks stream URLs with the newest of its keys (checks with any of them).

    Without a key yet (the shared one could not be read), :meth:`query` gives None and
    prediction bodies carry the plain URL, which still works with the owner's bearer token.
    """

    def __init__(
        self,
        ttl: int = DEFAULT_TTL,
        key: bytes | None = None,
        source: Callable[[bytes | None], Awaitable[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl = ttl
        self._keys: list[bytes] = [key] if key else []
        #: Reads (or first creates) the shared key, given the key this process holds.
        self._source = source
        self._clock = clock
        self._last_reload = float("-inf")

    @property
    def ready(self) -> bool:
        return bool(self._keys)

    def adopt(self, key: bytes) -> None:
        """Sign with ``key`` from now on; keep accepting the keys known before it."""
        self._keys = [key, *(k for k in self._keys if k != key)][:MAX_KEYS]

    def query(self, prediction_id: str) -> str | None:
        """``exp=…&sig=…`` for a URL valid ``ttl`` seconds from now, or None without a key."""
        if not self._keys:
            return None
        exp = int(self._clock()) + self.ttl
        return f"exp={exp}&sig={_signature(self._keys[0], prediction_id, exp)}"

    def verify(self, prediction_id: str, exp: str | None, sig: str | None) -> Signature:
        return self._verify("stream", prediction_id, exp, sig, forever=False)

    def sign(self, purpose: str, subject: str, exp: int) -> str | None:
        """The signature of ``subject`` for ``purpose`` (not ``stream``) until ``exp`` (unix
        seconds; 0: for ever), or None without a key."""
        if not self._keys:
            return None
        return _signature(self._keys[0], subject, exp, purpose)

    def verify_signed(
        self, purpose: str, subject: str, exp: str | None, sig: str | None
    ) -> Signature:
        """What a :meth:`sign` signature is worth; ``exp`` 0 never expires."""
        return self._verify(purpose, subject, exp, sig, forever=True)

    async def check_signed(
        self, purpose: str, subject: str, exp: str | None, sig: str | None
    ) -> Signature:
        """:meth:`verify_signed`, re-reading the shared key once when refused (as :meth:`check`)."""
        verdict = self.verify_signed(purpose, subject, exp, sig)
        if verdict is Signature.FORGED and exp is not None and sig is not None:
            if await self.reload():
                verdict = self.verify_signed(purpose, subject, exp, sig)
        return verdict

    def _verify(
        self, purpose: str, subject: str, exp: str | None, sig: str | None, *, forever: bool
    ) -> Signature:
        if exp is None or sig is None or not _EXP.fullmatch(exp) or not _SIG.fullmatch(sig):
            return Signature.FORGED
        expires = int(exp)
        # Every key is tried, whatever matches: the time taken says nothing of which one did.
        matches = [
            hmac.compare_digest(_signature(key, subject, expires, purpose), sig)
            for key in self._keys
        ]
        if not any(matches):
            return Signature.FORGED
        if forever and expires == 0:
            return Signature.VALID
        return Signature.VALID if expires > self._clock() else Signature.EXPIRED

    async def check(self, prediction_id: str, exp: str | None, sig: str | None) -> Signature:
        """:meth:`verify`, re-reading the shared key once when the signature is refused: it
        may have been made by a process that created the key after this one read it."""
        verdict = self.verify(prediction_id, exp, sig)
        if verdict is Signature.FORGED and exp is not None and sig is not None:
            if await self.reload():
                verdict = self.verify(prediction_id, exp, sig)
        return verdict

    async def reload(self) -> bool:
        """Read the shared key (at most every ``RELOAD_INTERVAL`` s); True if it was new.
        An unreachable Redis is logged and leaves the keys as they were."""
        now = time.monotonic()
        if self._source is None or now - self._last_reload < RELOAD_INTERVAL:
            return False
        # Claimed before the first await: concurrent callers return at once instead of queueing
        # behind a Redis that may be slow to answer.
        self._last_reload = now
        try:
            key = await self._source(self._keys[0] if self._keys else None)
        except TRANSIENT as error:
            log.warning("could not read the stream signing key: %r", error)
            return False
        new = not self._keys or key != self._keys[0]
        self.adopt(key)
        return new

    async def load(self) -> None:
        """Read the shared key, waiting out a Redis outage (``persistently``)."""
        source = self._source
        if source is None or self._keys:
            return
        self.adopt(await persistently("reading the stream signing key", lambda: source(None)))


async def shared_key(redis: Redis, held: bytes | None = None) -> bytes:
    """The key every process signs with, stored in Redis; the first reader creates it.

    A process that already holds a key offers that one, so a Redis that lost its data gets
    back the key links were signed with rather than a new one.
    """
    offer = held or secrets.token_bytes(32)
    await redis.set(keys.STREAM_SIGNING_KEY, base64.b64encode(offer), nx=True)
    stored = await redis.get(keys.STREAM_SIGNING_KEY)
    if stored is None:  # deleted between the two commands: ours stands
        return offer
    return base64.b64decode(stored)


class StreamUrlSettings(BaseSettings):
    """``CONDUIT_STREAM_*``: shared by the api and directors, which both render stream URLs."""

    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_STREAM_", extra="ignore", env_ignore_empty=True
    )

    #: The HMAC key of stream URLs, the same in every process; unset, one is made in Redis.
    signing_key: SecretStr | None = None
    #: Seconds a rendered stream URL stays valid (each render starts a new period).
    url_ttl: int = Field(DEFAULT_TTL, ge=60)

    @field_validator("signing_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            return None
        if value is not None and len(value.get_secret_value()) < MIN_KEY_LENGTH:
            raise ValueError(f"must be at least {MIN_KEY_LENGTH} characters (a random string)")
        return value

    def signer(self, redis: Redis) -> StreamSigner:
        """A signer with the configured key, or one that reads the shared key from ``redis``
        (call :meth:`StreamSigner.load`, as directors do, or :meth:`StreamSigner.reload`, as the
        api does, before relying on it)."""
        if self.signing_key is not None:
            return StreamSigner(self.url_ttl, key=self.signing_key.get_secret_value().encode())

        async def source(held: bytes | None) -> bytes:
            return await shared_key(redis, held)

        return StreamSigner(self.url_ttl, source=source)
