"""The end-to-end core path on a 3-master Redis Cluster: the same tests as on one Redis.

The tests are those of ``tests/e2e`` (imported, not copied): this directory's conftest gives
them a stack whose api, director and runner run with a ``redis+cluster://`` URL. Left out are
those that reach into Redis with a plain client of their own (expiring a stream's history,
watching ``MONITOR``). A deployment's streams and its version's carry different hash tags, so
every run here also crosses slots in the director's blocking read, and the event streams of
these predictions land on several nodes.
"""

from __future__ import annotations

import concurrent.futures

import httpx

from tests.conftest import ECHO, Stack
from tests.e2e.test_predictions import (
    test_deployment_prediction_succeeds_with_full_output,
    test_failing_model_records_error_and_logs,
    test_get_unknown_prediction_is_404,
    test_iterator_output_keeps_order,
    test_list_is_newest_first_and_paginates,
    test_version_and_model_forms_run,
)
from tests.e2e.test_prefer_wait import (
    test_fast_model_returns_finished_prediction,
    test_run_returns_full_output_for_a_model_slower_than_the_wait,
    test_slow_model_answers_starting_after_the_wait,
)
from tests.e2e.test_sse import (
    official,
    test_cancel_ends_the_stream_with_reason,
    test_failed_prediction_streams_error_then_done,
    test_late_join_gets_history_and_last_event_id_resumes,
    test_live_stream_yields_outputs_in_order_then_done,
    test_official_client_streams,
    test_the_stream_url_resumes_without_a_bearer_token,
)
from tests.fixtures.api import create
from tests.fixtures.redis_topologies import RedisClusterTopology
from tests.fixtures.sse import read_stream
from tests.scale.conftest import cluster_client, node_clients
from tracker.keys import events_key, slot_tag

__all__ = [
    "official",
    "test_cancel_ends_the_stream_with_reason",
    "test_deployment_prediction_succeeds_with_full_output",
    "test_failed_prediction_streams_error_then_done",
    "test_failing_model_records_error_and_logs",
    "test_fast_model_returns_finished_prediction",
    "test_get_unknown_prediction_is_404",
    "test_iterator_output_keeps_order",
    "test_late_join_gets_history_and_last_event_id_resumes",
    "test_list_is_newest_first_and_paginates",
    "test_live_stream_yields_outputs_in_order_then_done",
    "test_official_client_streams",
    "test_run_returns_full_output_for_a_model_slower_than_the_wait",
    "test_slow_model_answers_starting_after_the_wait",
    "test_the_stream_url_resumes_without_a_bearer_token",
    "test_version_and_model_forms_run",
]


def test_streams_on_every_node_are_followed_by_one_reader_per_tag(
    client: httpx.Client, stack: Stack, redis_cluster: RedisClusterTopology
) -> None:
    """Predictions whose event streams live on different nodes stream side by side, and the
    api reads them with one connection per tag on the node that serves it."""
    path = f"/v1/deployments/{ECHO}/predictions"
    created = [
        create(client, path, input={"prompt": f"s{i}", "n": 3, "delay": 0.3}) for i in range(12)
    ]
    tags = {slot_tag(events_key(p["id"], clustered=True)) for p in created}
    with concurrent.futures.ThreadPoolExecutor(len(created)) as pool:
        streams = list(pool.map(lambda p: read_stream(client, p["id"]), created))
    for prediction, stream in zip(created, streams, strict=True):
        prefix = prediction["input"]["prompt"]
        outputs = [e.data for e in stream if e.event == "output"]
        assert outputs == [f"{prefix}-{i}" for i in range(3)]
    readers = []
    for node in node_clients(redis_cluster):
        with node:
            listed = node.client_list()
        readers.append(sum(1 for c in listed if c["name"] == "conduit-api-events"))
    nodes_with_tags = {
        next(i for i, n in enumerate(redis_cluster.nodes) if n.port == port)
        for port in _ports_of(redis_cluster, tags)
    }
    assert sum(readers) >= len(nodes_with_tags) >= 2, (readers, tags)
    assert all(readers[i] for i in nodes_with_tags), (readers, nodes_with_tags)


def _ports_of(topology: RedisClusterTopology, tags: set[str]) -> set[int]:
    with cluster_client(topology) as client:
        return {int(client.get_node_from_key(f"{{{tag}}}").port) for tag in tags}
