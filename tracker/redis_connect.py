"""Redis clients from a URL: one Redis, a Sentinel-watched master, or a Redis Cluster.

=========================================================================  =====================
``redis://[[user]:password@]host:port/db``, ``rediss://…`` (TLS)            one Redis
``redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]``  the master Sentinel
                                                                            names for ``service``
``redis+cluster://[[user]:password@]host:port[,host:port…]``                a Redis Cluster
=========================================================================  =====================

``rediss+sentinel://`` and ``rediss+cluster://`` speak TLS (to the sentinels and the servers
alike). The user and password are the servers'; sentinels that want a password of their own
take ``?sentinel_password=…``. Other query parameters are passed on as redis-py's URL options.

A single Redis is opened exactly as before there were other forms (no extra round trip). A
cluster client is handed out under the ``Redis`` type: it answers every command Conduit sends
(the callers group keys per slot, see :mod:`tracker.keys`), and the few places that must act
differently ask :func:`is_cluster`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisClusterException, RedisError

log = logging.getLogger(__name__)

Kind = Literal["single", "sentinel", "cluster"]
_SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
#: Sentinels answer at once or are down: do not wait long on one that does not answer.
SENTINEL_TIMEOUT = 2.0


class InvalidRedisUrl(ValueError):
    """``REDIS_URL`` is not one of the forms above."""


class EvictingRedis(RuntimeError):
    """Redis may evict keys (``maxmemory-policy`` other than ``noeviction``)."""


@dataclass(frozen=True, slots=True)
class RedisUrl:
    """What a ``redis+sentinel://`` or ``redis+cluster://`` URL says."""

    kind: Kind
    #: The sentinels, or the cluster's startup nodes.
    hosts: tuple[tuple[str, int], ...]
    tls: bool = False
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    #: Query parameters, typed as redis-py types them in its own URLs.
    options: dict[str, Any] = field(default_factory=dict)

    def server_kwargs(self) -> dict[str, Any]:
        """Connection arguments for the Redis servers themselves."""
        kwargs: dict[str, Any] = {**self.options, "username": self.username}
        kwargs["password"] = self.password
        if self.tls:
            kwargs["ssl"] = True
        return kwargs


def kind_of(url: str) -> Kind:
    scheme = url.partition("://")[0].lower()
    return _SCHEMES.get(scheme, ("single", False))[0]


def parse_url(url: str) -> RedisUrl:
    """Parse a ``redis+sentinel://`` or ``redis+cluster://`` URL (plain ones are redis-py's)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise InvalidRedisUrl(
            f"REDIS_URL: expected redis+sentinel:// or redis+cluster://, got {url!r}"
        )
    kind, tls = _SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        hostlist = netloc
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = tuple(_host_port(item, url) for item in hostlist.split(",") if item)
    if not hosts:
        raise InvalidRedisUrl(f"REDIS_URL names no host: {url!r}")
    options = _options(query, url)
    sentinel_password = options.pop("sentinel_password", None)
    parts = [unquote(p) for p in path.split("/") if p]
    service, db = "", 0
    if kind == "sentinel":
        if not parts or len(parts) > 2:
            raise InvalidRedisUrl(
                f"REDIS_URL: a sentinel URL ends with /<service>[/<db>], got {url!r}"
            )
        service = parts[0]
        db = _db(parts[1], url) if len(parts) == 2 else 0
    elif parts:
        if len(parts) > 1 or _db(parts[0], url) != 0:
            raise InvalidRedisUrl(f"REDIS_URL: a Redis Cluster has database 0 only, got {url!r}")
    return RedisUrl(kind, hosts, tls, service, db, username, password, sentinel_password, options)


def _options(query: str, url: str) -> dict[str, Any]:
    """Query parameters typed as redis-py types them in its own URLs."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query):
        parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            options[name] = parser(value) if parser else value
        except (TypeError, ValueError):
            raise InvalidRedisUrl(f"REDIS_URL: invalid value for {name!r} in {url!r}") from None
    return options


def _host_port(item: str, url: str) -> tuple[str, int]:
    if item.startswith("["):  # [::1]:26379
        host, _, port = item[1:].partition("]:")
    else:
        host, _, port = item.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidRedisUrl(f"REDIS_URL: expected host:port, got {item!r} in {url!r}")
    return host, int(port)


def _db(text: str, url: str) -> int:
    if not text.isdigit():
        raise InvalidRedisUrl(f"REDIS_URL: the database must be a number, got {text!r} in {url!r}")
    return int(text)


def _retry() -> Retry:
    # After a Redis restart every pooled connection is dead; without retries each would fail
    # one request before reconnecting.
    return Retry(ExponentialBackoff(cap=0.5, base=0.01), retries=3)


#: No read timeout on a command's reply (a URL's ``?socket_timeout=`` still sets one). redis-py
#: 8 reads with a 5 s timeout by default, kept on the event loop's clock: after a pause of the
#: process longer than that (SIGSTOP, a VM or GC stall) the timeout fires on resume even though
#: the reply already waits in the socket, the reply is thrown away and the command is sent
#: again. A director's blocking XREADGROUP then leaves the entries Redis handed it pending for
#: it with nobody running them, until the visibility timeout; a script or XADD runs twice.
NO_READ_TIMEOUT: dict[str, Any] = {"socket_timeout": None}


def connect(url: str, max_connections: int | None = None, client_name: str | None = None) -> Redis:
    """One Redis client (and pool) per process.

    Retries a command a few times on a broken connection. With ``max_connections`` the pool
    is bounded and a command waits for a free connection rather than failing (in a cluster
    the bound is per node, and a command past it fails); ``client_name`` names the
    connections in ``CLIENT LIST``.
    """
    kind = kind_of(url)
    if kind == "single":
        if max_connections is not None:
            pool = BlockingConnectionPool.from_url(
                url,
                **NO_READ_TIMEOUT,
                max_connections=max_connections,
                timeout=None,
                client_name=client_name,
                health_check_interval=30,
                retry=_retry(),
            )
            return Redis.from_pool(pool)
        client: Redis = Redis.from_url(
            url,
            **NO_READ_TIMEOUT,
            health_check_interval=30,
            retry=_retry(),
            client_name=client_name,
        )
        return client
    parsed = parse_url(url)
    if kind == "sentinel":
        return _sentinel_master(parsed, max_connections, client_name)
    return _cluster(parsed, max_connections, client_name)


def connect_dedicated(url: str, client_name: str | None = None) -> Redis:
    """A client of one connection of its own (not a pool's), for a long blocking read whose
    ``CLIENT ID`` must stay put. Not for a cluster: there a blocking read names one node
    (:func:`node_client`)."""
    kind = kind_of(url)
    if kind == "single":
        single: Redis = Redis.from_url(url, single_connection_client=True, client_name=client_name)
        return single
    parsed = parse_url(url)
    if kind == "cluster":
        raise InvalidRedisUrl("a dedicated connection names one node in a Redis Cluster")
    pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
        parsed.service,
        _sentinel(parsed),
        db=parsed.db,
        client_name=client_name,
        **parsed.server_kwargs(),
    )
    client = Redis(connection_pool=pool, single_connection_client=True)
    client.auto_close_connection_pool = True
    return client


def node_client(url: str, host: str, port: int, client_name: str | None = None) -> Redis:
    """A single-connection client to one node of the cluster of ``url`` (its credentials and
    TLS)."""
    parsed = parse_url(url)
    return Redis(
        host=host,
        port=port,
        single_connection_client=True,
        client_name=client_name,
        **parsed.server_kwargs(),
    )


def decoded(value: bytes | str) -> str:
    """A reply field as text: clients built without ``decode_responses`` give bytes."""
    return value.decode() if isinstance(value, bytes) else value


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster)


def as_cluster(client: object) -> RedisCluster:
    if not isinstance(client, RedisCluster):
        raise TypeError(f"not a Redis Cluster client: {client!r}")
    return client


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The master's pool, waiting for a free connection as ``BlockingConnectionPool`` does."""


def _sentinel(parsed: RedisUrl) -> Sentinel:
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
        "password": parsed.sentinel_password,
    }
    if parsed.tls:
        sentinel_kwargs["ssl"] = True
    return Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.hosts), sentinel_kwargs=sentinel_kwargs
    )


def _sentinel_master(
    parsed: RedisUrl, max_connections: int | None, client_name: str | None
) -> Redis:
    kwargs: dict[str, Any] = {
        **NO_READ_TIMEOUT,
        "db": parsed.db,
        "client_name": client_name,
        "health_check_interval": 30,
        "retry": _retry(),
        **parsed.server_kwargs(),
    }
    pool_class: type[SentinelConnectionPool] = SentinelConnectionPool
    if max_connections is not None:
        pool_class = _BlockingSentinelPool
        kwargs.update(max_connections=max_connections, timeout=None)
    master: Redis = _sentinel(parsed).master_for(
        parsed.service, connection_pool_class=pool_class, **kwargs
    )
    return master


class _Cluster(RedisCluster):
    """A cluster client that learns the slot map before its first command.

    redis-py resolves a command's routing before it initializes the client: commands sent by
    many tasks at once on a fresh client go to an arbitrary node, come back MOVED, and the
    slot-map refresh that follows closes connections other commands are using; those are then
    retried, and a write whose reply was lost runs twice (seen here as repeated events).
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


def _cluster(parsed: RedisUrl, max_connections: int | None, client_name: str | None) -> Redis:
    kwargs = parsed.server_kwargs()
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    # No read timeout, as on a single Redis (NO_READ_TIMEOUT): a blocking read waits its whole
    # block, and a read cut short is retried by the client.
    kwargs.setdefault("socket_timeout", None)
    cluster = _Cluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
        client_name=client_name,
        health_check_interval=30,
        **kwargs,
    )
    return cast(Redis, cluster)


async def require_noeviction(redis: Redis) -> None:
    """Refuse a Redis that may evict keys: an evicted input stream loses the predictions queued
    in it, an evicted event stream the end of a run, and nothing tells anyone.

    Reads ``INFO memory`` (managed services often disable ``CONFIG``), on every primary of a
    cluster. A Redis that does not answer now is not judged (the process starts, as it does
    with Redis away, and its reads retry).
    """
    try:
        if is_cluster(redis):
            cluster = as_cluster(redis)
            replies: Any = await cluster.info("memory", target_nodes=RedisCluster.PRIMARIES)
            infos = list(replies.values()) if isinstance(replies, dict) else [replies]
        else:
            infos = [await redis.info("memory")]
    except (RedisError, RedisClusterException, OSError) as error:
        log.warning("could not check Redis's maxmemory-policy now: %r", error)
        return
    for info in infos:
        policy = info.get("maxmemory_policy", "noeviction")
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy != "noeviction":
            raise EvictingRedis(
                f"Redis runs with maxmemory-policy {policy}: it may evict keys, and an evicted "
                "stream loses the predictions queued in it without a trace. Set "
                "maxmemory-policy noeviction (Redis then refuses writes when full, which "
                "Conduit reports as 503s instead of losing work)."
            )
