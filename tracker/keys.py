"""Every Redis key and channel Conduit uses, built and parsed here and nowhere else (the
gateway's sessions and quota: ``tracker.gateway_keys``, beside this module).

Keys of one deployable share a Redis Cluster hash tag (the part in braces), so a director's read
of several shards and the enqueue and ack scripts touch one slot (callers group batches per
tag, ``tracker.hash_slots``; ``slot_tag`` tells them how). Per-prediction event streams carry the
prediction's own tag on a single Redis. In a Redis Cluster they carry one of
``EVENT_TAGS`` shared tags instead (``events_key(id, clustered=True)``): a blocking ``XREAD``
names keys of one slot only, so an api's one reader of every watched stream becomes one reader
per tag, a bounded number, where per-prediction tags would need one per prediction.

====================================  ===========================================================
``input:prediction:{dp-o/n}:3``       shard 3 of deployment ``o/n``'s input stream (``vp-<id>``
                                      for a version)
``dead:{dp-o/n}:3``                   dead letters of that shard (same tag as its stream)
``events:prediction:{<id>}``          a prediction's event stream (SSE, ``Prefer: wait``); in a
                                      Redis Cluster ``events:prediction:{ev<n>-<salt>}:<id>``
``lock:reconcile:{dp-o/n}``           one reconciler per deployable at a time
``director:alive:<consumer>``         present while that director heartbeats; names its runs
``conduit:epoch``                     when this Redis's data began (a restart without data
                                      starts a new epoch)
``cancel:predictions``                pub/sub channel: ids of predictions to cancel
``conduit:stream-signing-key``        the key of stream capability URLs, when none is
                                      configured (``tracker.stream_urls``)
``fleet:{fleet}:runner:<id>``         a runner's fleet entry (JSON, expires unless its director
                                      heartbeats; ``tracker.fleet``)
``fleet:{fleet}:runners``             sorted set of fleet entry ids by last heartbeat (ms)
``lane:{lane}:members``               sorted set of the api replicas serving the synchronous lane,
                                      by last heartbeat (ms; ``lane.membership``)
``ratelimit:{acct-<id>}:create``      an account's rate of creates: when its next one is due
                                      (µs; ``tracker.rate_limits``)
``ratelimit:{acct-<id>}:upload``      the same for an account's uploads
====================================  ===========================================================

The deployable's name (``dp-o/n``, ``vp-<version id>``) is also what Postgres stores in
``predictions.target``.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import random
import zlib
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

#: Shards of its deployable an account may use: one account's flood fills at most this many.
SHARDS_PER_ACCOUNT = 2
#: Shard streams of a new deployment or version: 2 of 16 make a given account share both of
#: a given flooder's 1 time in 120 (2 of 8: 1 in 28); directors read them all in one script
#: call per turn, so more shards cost little (``tracker.sharding``).
DEFAULT_SHARDS = 16
INPUT_PREFIX = "input:prediction:"
DEAD_PREFIX = "dead:"
EVENTS_PREFIX = "events:prediction:"
EPOCH_KEY = "conduit:epoch"
CANCEL_CHANNEL = "cancel:predictions"
STREAM_SIGNING_KEY = "conduit:stream-signing-key"
#: Bumped by every write to the catalogue (models, versions, deployments, grants): each
#: process's catalogue cache reloads what it cached before (``catalog.cache``).
CATALOG_GENERATION_KEY = "conduit:catalog-generation"


class Kind(enum.StrEnum):
    """What a deployable is, as the prefix of its name."""

    DEPLOYMENT = "dp"  # a deployment's predictions
    VERSION = "vp"  # a version's predictions (a model's: its latest version)
    TRAINING = "tp"  # trainings of a version (``/v1/trainings``), for its trainers


def deployable(kind: str, key: str) -> str:
    """``dp-owner/name`` or ``vp-<version id>``: the name a deployable's keys are tagged with."""
    return f"{kind}-{key}"


def input_stream(kind: str, key: str, shard: int) -> str:
    return f"{INPUT_PREFIX}{{{deployable(kind, key)}}}:{shard}"


@dataclass(frozen=True, slots=True)
class StreamName:
    """What an input stream's name says: whose shard it is."""

    kind: str  # "dp", "vp", ...
    key: str  # deployment "owner/name" or version id
    shard: int

    @property
    def deployable(self) -> str:
        return deployable(self.kind, self.key)


def parse_input_stream(name: str) -> StreamName | None:
    """``input:prediction:{dp-o/n}:3``; None for anything else."""
    if not name.startswith(INPUT_PREFIX + "{"):
        return None
    named, closing, shard = name[len(INPUT_PREFIX) + 1 :].rpartition("}:")
    if not closing:
        return None
    kind, dash, key = named.partition("-")
    if not dash or not key or not shard.isdigit():
        return None
    return StreamName(kind, key, int(shard))


def dead_letter_stream(stream: str) -> str:
    """Where entries of ``stream`` that kept failing go: beside it, under the same tag."""
    parsed = parse_input_stream(stream)
    if parsed is None:
        return f"{DEAD_PREFIX}{stream}"
    return f"{DEAD_PREFIX}{{{parsed.deployable}}}:{parsed.shard}"


def is_dead_letter_stream(key: str) -> bool:
    """Whether ``key`` names a dead-letter stream (:func:`dead_letter_stream`)."""
    return key.startswith(DEAD_PREFIX)


#: Hash tags event streams share in a Redis Cluster: an api holds one blocking reader per tag
#: it has waiters on, and event writes spread over this many slots. Every process of a
#: deployment must agree on it, so it is a constant.
EVENT_TAGS = 16


def _event_tags(count: int) -> tuple[str, ...]:
    """``count`` tags whose slots fall in ``count`` equal slot ranges, one in each: however a
    cluster splits its slots into ranges of about equal size, event streams spread evenly
    over its nodes. (The first ``ev<n>-<salt>`` that hashes into range n; deterministic.)"""
    width = REDIS_CLUSTER_HASH_SLOTS // count
    tags = []
    for n in range(count):
        for salt in itertools.count():
            tag = f"ev{n}-{salt}"
            if key_slot(tag.encode()) // width == n:
                tags.append(tag)
                break
    return tuple(tags)


EVENT_TAG_NAMES = _event_tags(EVENT_TAGS)


def events_key(prediction_id: str, clustered: bool = False) -> str:
    """A prediction's event stream; ``clustered``: its name in a Redis Cluster."""
    if clustered:
        tag = EVENT_TAG_NAMES[zlib.crc32(prediction_id.encode()) % EVENT_TAGS]
        return f"{EVENTS_PREFIX}{{{tag}}}:{prediction_id}"
    return f"{EVENTS_PREFIX}{{{prediction_id}}}"


#: Entries kept in a doorbell stream (about: ``MAXLEN ~``); a reader further behind reads
#: every stream it watches once (the hub's sweep).
DOORBELL_MAX_LEN = 10_000


def doorbell_key(tag: str = "") -> str:
    """The stream every event append rings, naming the event streams it appended to: one on a
    single Redis (``tag`` empty), one per event tag in a cluster (in the tag's slot). An event
    hub blocks on it alone and reads only the streams it names, rather than blocking on every
    stream it watches (``tracker.event_readers``)."""
    return f"events:doorbell:{{{tag}}}" if tag else "events:doorbell"


def alive_key(consumer: str) -> str:
    """Present while the director named ``consumer`` is alive (refreshed by its heartbeat)."""
    return f"director:alive:{consumer}"


def reconcile_lock_key(deployable_name: str) -> str:
    """The lock of ``dp-owner/name`` (see :func:`deployable`)."""
    return f"lock:reconcile:{{{deployable_name}}}"


def slot_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes: the first non-empty ``{…}``, else all of it.
    Keys with equal tags live in one slot and may share a script call."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def shard_moves_key(deployable: str) -> str:
    """Hash of account id → the shards (``3,9``) an operator moved it to on ``deployable``
    (``tracker.sharding``); tagged as its streams, so the enqueue script reads it in place."""
    return f"shards:{{{deployable}}}:moves"


def account_shards(
    account_id: int, deployable: str, shards: int, k: int = SHARDS_PER_ACCOUNT
) -> list[int]:
    """The k shards (of ``shards``) this account may use for this deployable; deterministic."""
    seed = hashlib.sha256(f"{account_id}/{deployable}".encode()).digest()
    return sorted(random.Random(seed).sample(range(shards), min(k, shards)))


@dataclass(frozen=True, slots=True)
class Target:
    """Where a new prediction goes: a deployment's or a version's shard streams."""

    kind: Kind
    key: str  # deployment "owner/name" or version id
    shards: int

    @classmethod
    def deployment(cls, name: str, shards: int) -> Target:
        return cls(Kind.DEPLOYMENT, name, shards)

    @classmethod
    def version(cls, version_id: str, shards: int) -> Target:
        return cls(Kind.VERSION, version_id, shards)

    @classmethod
    def training(cls, version_id: str, shards: int) -> Target:
        return cls(Kind.TRAINING, version_id, shards)

    @property
    def name(self) -> str:
        """``dp-owner/name``, ``vp-<version id>`` or ``tp-<version id>``: its hash tag, and
        ``predictions.target``."""
        return deployable(self.kind, self.key)

    @property
    def reconcile_lock(self) -> str:
        return reconcile_lock_key(self.name)

    def stream(self, shard: int) -> str:
        return input_stream(self.kind, self.key, shard)

    def all_streams(self) -> list[str]:
        return [self.stream(shard) for shard in range(self.shards)]

    def streams_for(self, account_id: int) -> list[str]:
        return [self.stream(s) for s in account_shards(account_id, self.name, self.shards)]

    def owns(self, stream: str) -> bool:
        """Whether ``stream`` is one of this target's shards, under any shard count."""
        parsed = parse_input_stream(stream)
        return parsed is not None and (parsed.kind, parsed.key) == (self.kind, self.key)


# --- The fleet registry (``tracker.fleet``) ------------------------------------------------
# Every fleet key shares one hash tag, so a reader's index read plus MGET of every entry, and
# the prune script, touch one slot (one node of a Redis Cluster).

FLEET_TAG = "fleet"
FLEET_PREFIX = f"fleet:{{{FLEET_TAG}}}:"
FLEET_INDEX = f"{FLEET_PREFIX}runners"


def fleet_entry_key(runner_id: str) -> str:
    """A runner's fleet entry; it expires when its heartbeats stop."""
    return f"{FLEET_PREFIX}runner:{runner_id}"


# --- The synchronous lane (``lane``) ---------------------------------------------------
# One hash tag for the lane's keys: a replica's heartbeat, prune and read are one pipeline.

LANE_TAG = "lane"
LANE_MEMBERS = f"lane:{{{LANE_TAG}}}:members"
"""Sorted set of api replica ids scored by their last heartbeat (ms); readers prune the old."""


def lane_loans_key(runner_id: str) -> str:
    """Hash of api replica id → permits it borrowed of the runner's shared ones (``lane.loans``)."""
    return f"lane:{{{LANE_TAG}}}:loans:{runner_id}"


# --- Per-account rates (``tracker.rate_limits``) --------------------------------------
# One key, and one hash tag, per account: its script names one slot, and a Redis Cluster
# spreads the accounts over its nodes.


def create_rate_key(account_id: int) -> str:
    """The account's theoretical arrival time for creates (GCRA), shared by every replica."""
    return f"ratelimit:{{acct-{account_id}}}:create"


def upload_rate_key(account_id: int) -> str:
    """The account's theoretical arrival time for uploads (GCRA), shared by every replica."""
    return f"ratelimit:{{acct-{account_id}}}:upload"
