"""``REDIS_URL`` forms (sans IO): what each says, and the mistakes refused with a reason."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from tracker import keys
from tracker.redis_connect import InvalidRedisUrl, kind_of, parse_url


def test_sentinel_url_names_its_sentinels_service_db_and_password() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379,[::1]:26380/conduit/2?sentinel_password=x"
    parsed = parse_url(url)
    assert parsed.kind == "sentinel" and not parsed.tls
    assert parsed.hosts == (("10.0.0.1", 26379), ("::1", 26380))
    assert (parsed.service, parsed.db) == ("conduit", 2)
    assert (parsed.username, parsed.password, parsed.sentinel_password) == (None, "s@cret", "x")
    assert parsed.server_kwargs() == {"username": None, "password": "s@cret"}


def test_tls_forms_and_cluster_startup_nodes() -> None:
    assert parse_url("rediss+sentinel://h:1/svc").tls
    cluster = parse_url("rediss+cluster://user:pw@a:7000,b:7001")
    assert cluster.kind == "cluster" and cluster.tls
    assert cluster.hosts == (("a", 7000), ("b", 7001))
    assert cluster.server_kwargs() == {"username": "user", "password": "pw", "ssl": True}
    assert parse_url("redis+cluster://a:7000/0").db == 0
    typed = parse_url("redis+cluster://a:7000?socket_timeout=2.5&health_check_interval=10")
    assert typed.options == {"socket_timeout": 2.5, "health_check_interval": 10}


def test_plain_urls_stay_redis_pys() -> None:
    assert kind_of("redis://127.0.0.1:6379/0") == "single"
    assert kind_of("rediss://h:6380/1") == "single"
    assert kind_of("REDIS+CLUSTER://h:1") == "cluster"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "/<service>"),
        ("redis+sentinel://h:26379/svc/0/extra", "/<service>"),
        ("redis+sentinel://h:26379/svc/zero", "must be a number"),
        ("redis+cluster://h:7000/3", "database 0 only"),
        ("redis+cluster://h", "host:port"),
        ("redis+cluster:///", "no host"),
        ("redis://h:1", "expected redis+sentinel"),
        ("redis+cluster://h:1?socket_timeout=soon", "invalid value for 'socket_timeout'"),
    ],
)
def test_mistakes_are_refused_with_what_was_expected(url: str, says: str) -> None:
    with pytest.raises(InvalidRedisUrl, match=says.replace("+", r"\+")):
        parse_url(url)


def test_cluster_event_streams_share_a_few_tags_spread_over_the_slot_space() -> None:
    assert keys.events_key("p1") == "events:prediction:{p1}"
    tags = {keys.slot_tag(keys.events_key(f"p{i}", clustered=True)) for i in range(2000)}
    assert tags == set(keys.EVENT_TAG_NAMES) and len(tags) == keys.EVENT_TAGS
    ranges = sorted(key_slot(tag.encode()) * keys.EVENT_TAGS // 16384 for tag in tags)
    assert ranges == list(range(keys.EVENT_TAGS))
