"""Redis key names: built and parsed in one module, one hash tag per deployable (pure logic)."""

from __future__ import annotations

import pytest

from tracker import keys
from tracker.keys import StreamName


def test_keys_of_one_deployable_share_its_hash_tag() -> None:
    stream = keys.input_stream("dp", "acme/sdxl", 3)
    assert stream == "input:prediction:{dp-acme/sdxl}:3"
    assert keys.dead_letter_stream(stream) == "dead:{dp-acme/sdxl}:3"
    assert keys.reconcile_lock_key("dp-acme/sdxl") == "lock:reconcile:{dp-acme/sdxl}"
    tags = {keys.slot_tag(k) for k in (stream, keys.dead_letter_stream(stream))}
    assert tags == {"dp-acme/sdxl"}
    assert keys.slot_tag(keys.input_stream("dp", "acme/sdxl", 0)) == "dp-acme/sdxl"
    assert keys.slot_tag(keys.input_stream("vp", "ab" * 32, 0)) == "vp-" + "ab" * 32


def test_per_prediction_and_process_keys() -> None:
    assert keys.events_key("p1") == "events:prediction:{p1}"
    assert keys.slot_tag(keys.events_key("p1")) == "p1"
    assert keys.alive_key("host-1") == "director:alive:host-1"
    assert keys.EPOCH_KEY == "conduit:epoch"
    assert keys.CANCEL_CHANNEL == "cancel:predictions"


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("input:prediction:{dp-acme/sdxl}:3", StreamName("dp", "acme/sdxl", 3)),
        ("input:prediction:{vp-" + "ab" * 32 + "}:0", StreamName("vp", "ab" * 32, 0)),
        ("input:prediction:{dp-a-b/c-d}:12", StreamName("dp", "a-b/c-d", 12)),
    ],
)
def test_stream_names_parse(name: str, parsed: StreamName) -> None:
    assert keys.parse_input_stream(name) == parsed
    assert keys.input_stream(parsed.kind, parsed.key, parsed.shard) == name


@pytest.mark.parametrize(
    "name",
    [
        "dead:{dp-a/b}:0",
        "events:prediction:{p1}",
        "input:prediction:{dp-a/b}",
        "input:prediction:{dp-a/b}:x",
        "input:prediction:dp-a/b:",
        "input:prediction:nokind:1",
        "input:prediction:{dp-a/b:1",
        "input:prediction:dp-acme/sdxl:3",  # untagged, as before keys carried hash tags
    ],
)
def test_other_names_are_not_input_streams(name: str) -> None:
    assert keys.parse_input_stream(name) is None


def test_slot_tag_follows_redis_cluster_rules() -> None:
    assert keys.slot_tag("plain") == "plain"
    assert keys.slot_tag("a{}b{c}") == "a{}b{c}"  # an empty first tag: the whole key
    assert keys.slot_tag("a{b}c{d}") == "b"
    assert keys.slot_tag("a{b") == "a{b"
