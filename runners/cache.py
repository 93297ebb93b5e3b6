"""The runner's result cache: values a model computed before, reusable by later requests.

Entries are keyed by (model, key) and labelled with the tenant that created them and an
optional tag (``X-Cache-Tag``), so ``POST /v1/cache/flush`` can drop all of them, one model's,
one tenant's or one tag's. Bounded by bytes, least recently used evicted first. Sizes are
the caller's estimate of the value's memory (e.g. ``ndarray.nbytes``), so "memory freed" is
what the cache itself held, not a guess about the allocator.

``X-Cache-Mode`` decides how a request uses it: ``default`` reads and writes, ``refresh``
only writes (recompute, then replace), ``bypass`` neither.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from protocol.values import FlushScope


class CacheMode(StrEnum):
    DEFAULT = "default"
    REFRESH = "refresh"
    BYPASS = "bypass"

    @property
    def reads(self) -> bool:
        return self is CacheMode.DEFAULT

    @property
    def writes(self) -> bool:
        return self is not CacheMode.BYPASS


@dataclass(frozen=True, slots=True)
class _Entry:
    value: Any
    size: int
    tenant: str
    tag: str | None


@dataclass(frozen=True, slots=True)
class Flushed:
    entries: int
    bytes_freed: int


class ResultCache:
    """An LRU map bounded by ``max_bytes``; single-threaded (the runner's event loop)."""

    def __init__(self, max_bytes: int, on_lookup: Callable[[bool], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self._on_lookup = on_lookup
        self.bytes_used = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, model: str, key: str) -> Any | None:
        entry = self._entries.get((model, key))
        if self._on_lookup is not None:
            self._on_lookup(entry is not None)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end((model, key))
        self.hits += 1
        return entry.value

    def put(
        self, model: str, key: str, value: Any, size: int, tenant: str, tag: str | None = None
    ) -> None:
        if size > self.max_bytes:
            return
        self._drop((model, key))
        self._entries[(model, key)] = _Entry(value, size, tenant, tag)
        self.bytes_used += size
        while self.bytes_used > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def flush(self, scope: FlushScope, value: str | None = None) -> Flushed:
        """Drop every entry in scope (``value`` names the model, tenant or tag)."""
        if scope is not FlushScope.ALL and not value:
            raise ValueError(f"scope {scope.value!r} needs a value")
        entries = self._entries.items()
        doomed = [key for key, entry in entries if _in_scope(key, entry, scope, value)]
        before = self.bytes_used
        for key in doomed:
            self._drop(key)
        return Flushed(len(doomed), before - self.bytes_used)

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes_used -= entry.size


def _in_scope(key: tuple[str, str], entry: _Entry, scope: FlushScope, value: str | None) -> bool:
    if scope is FlushScope.ALL:
        return True
    if scope is FlushScope.MODEL:
        return key[0] == value
    if scope is FlushScope.TENANT:
        return entry.tenant == value
    return entry.tag == value


class CacheView:
    """One request's window on the cache: its model, tenant, tag and mode applied."""

    def __init__(
        self, cache: ResultCache, model: str, tenant: str, mode: CacheMode, tag: str | None
    ) -> None:
        self._cache = cache
        self.model = model
        self.tenant = tenant
        self.mode = mode
        self.tag = tag

    def get(self, key: str) -> Any | None:
        return self._cache.get(self.model, key) if self.mode.reads else None

    def put(self, key: str, value: Any, size: int) -> None:
        if self.mode.writes:
            self._cache.put(self.model, key, value, size, self.tenant, self.tag)
