"""The per-prediction event stream: ``events:prediction:{<id>}`` in Redis (``tracker.keys``).

Every change of a prediction is appended here in order: ``status`` (new status), ``output``
(one chunk, as text), ``logs`` (new log text), ``error`` and ``done``. It is the one source
for SSE and ``Prefer: wait``; the Redis entry id is the SSE event id, so ``Last-Event-ID``
resumes exactly. A stream expires ``retention`` seconds after its ``done``, and holds about
``max_len`` entries at most (the oldest are trimmed: a run that logs without end cannot grow
it without bound). Appends that
arrive together (many predictions at once) share one script call: build one ``EventLog`` per
process and share it. In a Redis Cluster a script call takes the streams of one slot only, so
appends are batched per hash tag there (event streams share ``keys.EVENT_TAGS`` tags in a
cluster: ``EventLog.key`` names them).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from tracker import keys
from tracker.group_commit import Batcher
from tracker.hash_slots import PerSlot
from tracker.redis_connect import decoded, is_cluster
from tracker.states import Status

DEFAULT_RETENTION = 3600
#: Entries kept per stream (about: trimmed with ``MAXLEN ~``).
DEFAULT_MAX_LEN = 100_000


class EventType(enum.StrEnum):
    STATUS = "status"
    OUTPUT = "output"
    LOGS = "logs"
    ERROR = "error"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    type: EventType
    data: str
    #: On ``done`` only: the finished prediction as JSON, so a waiter needs no database read.
    prediction: str | None = None


events_key = keys.events_key


def output_text(chunk: Any) -> str:
    """SSE ``output`` data is text: strings as they are, anything else as JSON."""
    return chunk if isinstance(chunk, str) else orjson.dumps(chunk).decode()


def done_data(status: str) -> str:
    """The ``done`` event's data: why, when the prediction did not run to its end."""
    if status in (Status.CANCELED, Status.ABORTED):
        return orjson.dumps({"reason": status}).decode()
    return "{}"


class EventLog:
    """Appends and reads predictions' events."""

    def __init__(
        self, redis: Redis, retention: int = DEFAULT_RETENTION, max_len: int = DEFAULT_MAX_LEN
    ) -> None:
        self.redis = redis
        self.retention = retention
        self.max_len = max_len
        self.clustered = is_cluster(redis)
        self._script = redis.register_script(_APPEND_SCRIPT)
        self._appends: Batcher[_Append, None] | PerSlot[_Append, None] = (
            PerSlot(self._write_appends, lambda append: append.key)
            if self.clustered
            else Batcher(self._write_appends)
        )

    def key(self, prediction_id: str) -> str:
        """The prediction's event stream in this Redis (its name differs in a cluster)."""
        return keys.events_key(prediction_id, self.clustered)

    async def append(
        self,
        prediction_id: str,
        events: Sequence[tuple[EventType, str]],
        final: str | None = None,
    ) -> None:
        if not events:
            return
        entries = []
        for kind, data in events:
            fields = {"type": kind.value, "data": data}
            if kind is EventType.DONE and final is not None:
                fields["prediction"] = final
            entries.append(fields)
        done = any(kind is EventType.DONE for kind, _ in events)
        await self._appends.submit(_Append(self.key(prediction_id), entries, done, self.retention))

    async def finish(
        self,
        prediction_id: str,
        status: str,
        error: str | None,
        extra: Sequence[tuple[EventType, str]] = (),
        final: str | None = None,
    ) -> None:
        """Append the terminal events: any last chunks, the status, the error, then ``done``
        (carrying ``final``, the finished prediction's JSON, when given)."""
        events = [*extra, (EventType.STATUS, status)]
        if error:
            events.append((EventType.ERROR, orjson.dumps({"detail": error}).decode()))
        events.append((EventType.DONE, done_data(status)))
        await self.append(prediction_id, events, final)

    async def _write_appends(self, appends: list[_Append]) -> list[None]:
        """Many predictions' events in one script call: one round trip and one command, far
        less client work than a command per event. Each prediction's events keep their order.
        (In a cluster ``appends`` share one hash tag.)"""
        script_keys: list[str] = []
        args: list[str | int] = [self.max_len, len(appends), keys.DOORBELL_MAX_LEN]
        for append in appends:
            script_keys.append(append.key)
            args += [len(append.entries), append.retention if append.expire else 0]
            for fields in append.entries:
                args.append(len(fields))
                for name, value in fields.items():
                    args += [name, value]
        tags = {keys.slot_tag(key) for key in script_keys} if self.clustered else {""}
        doorbells = [keys.doorbell_key(tag) for tag in sorted(tags)]
        await self._script(keys=[*script_keys, *doorbells], args=args)
        return [None] * len(appends)

    async def read(
        self, prediction_id: str, after: str, block_ms: int | None, count: int = 500
    ) -> list[Event]:
        """Events after ``after`` ("0" for all), waiting up to ``block_ms`` for the first."""
        reply: Any = await self.redis.xread(
            {self.key(prediction_id): after}, count=count, block=block_ms
        )
        return [
            self.parse(entry_id, fields)
            for _, entries in reply or []
            for entry_id, fields in entries
        ]

    @staticmethod
    def parse(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Event:
        """One stream entry as an event (for readers of many streams at once)."""
        final = fields.get(b"prediction")
        return Event(
            decoded(entry_id),
            EventType(decoded(fields[b"type"])),
            decoded(fields[b"data"]),
            decoded(final) if final is not None else None,
        )

    async def is_done(self, prediction_id: str) -> bool:
        """Whether the stream ends with ``done`` (nothing may follow it)."""
        reply: Any = await self.redis.xrevrange(self.key(prediction_id), count=1)
        return bool(reply) and reply[0][1].get(b"type") == EventType.DONE.value.encode()

    async def exists(self, prediction_id: str) -> bool:
        return bool(await self.redis.exists(self.key(prediction_id)))

    async def has_output(self, prediction_id: str, page: int = 500) -> bool:
        """Whether any ``output`` event was appended (a scan: for rare recovery paths only)."""
        key = self.key(prediction_id)
        start = "-"
        while True:
            entries: Any = await self.redis.xrange(key, min=start, count=page)
            if any(fields[b"type"] == EventType.OUTPUT.value.encode() for _, fields in entries):
                return True
            if len(entries) < page:
                return False
            start = "(" + decoded(entries[-1][0])


@dataclass(frozen=True, slots=True)
class _Append:
    key: str
    entries: list[dict[str, str]]
    expire: bool
    retention: int


# Many predictions' events in one command. KEYS: one event stream per append, then the
# doorbells to ring (``keys.doorbell_key``); ARGV: the streams' MAXLEN, the number of appends,
# the doorbells' MAXLEN, then per append in order: its entry count, its retention (0: no
# expiry yet), then per entry its field count and the fields and values. Each doorbell gets one
# entry naming every stream appended to (readers skip the ones they do not watch).
#
# Nothing follows ``done``: a stream that already ends with it takes no more entries. This is
# the fence's last word, checked where the append happens: an attempt that asked its fence,
# then stalled (a paused process) past a takeover and the other attempt's end, would otherwise
# add its live events after the end.
_APPEND_SCRIPT = """
local maxlen = ARGV[1]
local appends = tonumber(ARGV[2])
local a = 4
local rung = {}
local function ended(key)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  if last == nil then return false end
  local fields = last[2]
  for f = 1, #fields, 2 do
    if fields[f] == 'type' then return fields[f + 1] == 'done' end
  end
  return false
end
for k = 1, appends do
  local entries, retention = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local closed = ended(KEYS[k])
  for _ = 1, entries do
    local last = a + 2 * tonumber(ARGV[a])
    if not closed then
      redis.call('XADD', KEYS[k], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, a + 1, last))
    end
    a = last + 1
  end
  if not closed then
    if retention > 0 then redis.call('EXPIRE', KEYS[k], retention) end
    rung[#rung + 1] = KEYS[k]
  end
end
if #rung > 0 then
  local names = table.concat(rung, ' ')
  for d = appends + 1, #KEYS do
    redis.call('XADD', KEYS[d], 'MAXLEN', '~', ARGV[3], '*', 'k', names)
  end
end
return #rung
"""
