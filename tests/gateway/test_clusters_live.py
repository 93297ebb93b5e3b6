"""Two clusters on loopback (``tests.fixtures.two_clusters``): each gateway registers itself,
heartbeats and publishes its blocks; a block of the other cluster runs through that cluster's
gateway, logged there with its origin (a forged origin from an ordinary account is not); a
graph whose steps alternate between the clusters answers as one; a gateway killed
mid-graph fails the graph naming the step, nothing run twice; a dead gateway is no longer
routed to, its record kept and marked."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from sqlalchemy import create_engine, text

from conduit.services import ServiceUrls
from gateway.call_log import ORIGIN_ACCOUNT, ORIGIN_CLUSTER, PARENT_REQUEST
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher
from tests.fixtures.two_clusters import (
    A_BLOCKS,
    B_BLOCKS,
    CLUSTER_A,
    CLUSTER_B,
    SEARCH_A,
    SEARCH_B,
    TwoClusters,
    registry_state,
    two_clusters,
)
from tests.fixtures.waiting import until, wait_for
from tests.gateway.conftest import generate_stubs
from tests.gateway.test_server import run_example
from tracker.gateway_keys import session_keys


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="module")
def clusters(
    launcher: Launcher,
    admin: Admin,
    database_url: str,
    services: ServiceUrls,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TwoClusters]:
    logdir: Path = tmp_path_factory.mktemp("cluster-b-logs")
    logging = {"CONDUIT_GATEWAY_LOG": "true", "CONDUIT_GATEWAY_LOG_FLUSH_INTERVAL": "0.05"}
    with two_clusters(
        launcher, admin, database_url, services.database_url, redis_url, logdir, logging
    ) as world:
        yield world


def call(
    clusters: TwoClusters,
    block_id: str,
    data: dict[str, Any],
    graph: dict[str, list[str]] | None = None,
    timeout: float = 60,
) -> Any:
    packet = BlockInferencePacket(
        block_id=block_id,
        data=json.dumps(data),
        output_ptr=json.dumps({"graph": graph}) if graph else "",
    )
    with grpc.insecure_channel(clusters.a.address) as channel:
        answer = BlockInferenceServiceStub(channel).infer(
            packet, metadata=[("authorization", f"Bearer {clusters.user[1]}")], timeout=timeout
        )
    return json.loads(answer.data)


def test_each_gateway_registers_heartbeats_and_publishes(clusters: TwoClusters) -> None:
    state = registry_state(clusters.a.database_url)
    assert state[CLUSTER_A][0] == state[CLUSTER_B][0] == "alive"
    assert set(A_BLOCKS) <= state[CLUSTER_A][1] and not set(B_BLOCKS) & state[CLUSTER_A][1]
    assert {*B_BLOCKS, *SEARCH_B} == state[CLUSTER_B][1]


def test_a_block_of_the_other_cluster_runs_there(clusters: TwoClusters) -> None:
    before_a = len(clusters.a.predictions(clusters.user[0]))
    assert call(clusters, B_BLOCKS[0], {"prompt": "far"}) == {"got": {"prompt": "far"}}
    on_b = clusters.b.predictions(clusters.peer_on_b)
    assert [p["input"] for p in on_b][-1] == {"prompt": "far"}
    assert len(clusters.a.predictions(clusters.user[0])) == before_a  # nothing ran here


def logged(database_url: str, where: str, **params: Any) -> list[dict[str, Any]]:
    """The request log's entries in a cluster's database matching ``where``."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT request_id, session_id, block_id, origin, graph_parent, account_id"
                    f" FROM block_inference WHERE {where} ORDER BY ts"
                ),
                params,
            )
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def test_only_a_peer_says_where_a_call_came_from(clusters: TwoClusters) -> None:
    """A call cluster-123's gateway sends on to cluster-456 is logged there with its origin
    (``account@cluster``) and the request it is a step of; the same metadata sent by an
    ordinary account (not one of ``peer_accounts``) is ignored: no origin, no parent."""
    user, token = clusters.user
    session = f"o-{uuid.uuid4().hex[:8]}"
    packet = BlockInferencePacket(block_id=B_BLOCKS[0], session_id=session, data="{}")
    assert _code(clusters, packet) == grpc.StatusCode.OK
    (here,) = wait_for(
        lambda: logged(clusters.a.database_url, "session_id = :s", s=session),
        "the call logged on cluster-123",
    )
    (there,) = wait_for(
        lambda: logged(clusters.b.database_url, "graph_parent = :r", r=here["request_id"]),
        "the call sent on logged on cluster-456 as a step of it",
    )
    assert there["origin"] == f"{user}@{CLUSTER_A}" and there["block_id"] == B_BLOCKS[0]

    forged = f"f-{uuid.uuid4().hex[:8]}"
    metadata = [
        ("authorization", f"Bearer {token}"),
        (ORIGIN_ACCOUNT, "someone-else"),
        (ORIGIN_CLUSTER, CLUSTER_B),
        (PARENT_REQUEST, str(here["request_id"])),
    ]
    with grpc.insecure_channel(clusters.a.address) as channel:
        BlockInferenceServiceStub(channel).infer(
            BlockInferencePacket(block_id=A_BLOCKS[0], session_id=forged, data="{}"),
            metadata=metadata,
            timeout=60,
        )
    (entry,) = wait_for(
        lambda: logged(clusters.a.database_url, "session_id = :s", s=forged),
        "the forged call logged",
    )
    assert entry["origin"] is None and entry["graph_parent"] is None
    assert entry["account_id"] == here["account_id"] is not None


def test_a_graph_alternating_between_clusters(clusters: TwoClusters) -> None:
    a1, a2, b1, b2 = A_BLOCKS[0], A_BLOCKS[1], B_BLOCKS[0], B_BLOCKS[1]
    graph = {a1: [b1], b1: [a2], a2: [b2], b2: []}
    on_b_before = len(clusters.b.predictions(clusters.peer_on_b))
    answer = call(clusters, a1, {"prompt": "hop"}, graph)
    assert answer == {"got": {"got": {"got": {"got": {"prompt": "hop"}}}}}
    here = clusters.a.predictions(clusters.user[0])[-2:]
    assert [p["graph"]["step"] for p in here] == [a1, a2]
    assert all(p["status"] == "succeeded" for p in here)
    there = clusters.b.predictions(clusters.peer_on_b)[on_b_before:]
    assert [p["input"] for p in there] == [
        {"got": {"prompt": "hop"}},
        {"got": {"got": {"got": {"prompt": "hop"}}}},
    ]


async def test_a_gateway_killed_mid_graph_fails_the_graph_naming_its_step(
    clusters: TwoClusters,
) -> None:
    """SIGKILL cluster-456's gateway while its step runs: the graph fails UNAVAILABLE naming
    the step; the step after it never runs, the killed step ran once (its prediction ends
    there on its own); the dead gateway is then marked dead and not called (UNAVAILABLE
    before anything is sent), until it is back."""
    a1, a2, b1 = A_BLOCKS[0], A_BLOCKS[1], B_BLOCKS[2]
    graph = {a1: [b1], b1: [a2], a2: []}
    user, token = clusters.user
    a_before = len(clusters.a.predictions(user))
    b_before = len(clusters.b.predictions(clusters.peer_on_b))
    packet = BlockInferencePacket(
        block_id=a1,
        data=json.dumps({"slow_depth": 1, "slow_seconds": 3}),
        output_ptr=json.dumps({"graph": graph}),
    )
    async with grpc.aio.insecure_channel(clusters.a.address) as channel:
        pending = BlockInferenceServiceStub(channel).infer(
            packet, metadata=[("authorization", f"Bearer {token}")], timeout=60
        )

        async def b_running() -> bool:
            made = clusters.b.predictions(clusters.peer_on_b)[b_before:]
            return len(made) == 1 and made[0]["status"] == "processing"

        await until(b_running, "cluster-456's step running", timeout=60)
        assert clusters.b.gateway is not None
        clusters.b.gateway.kill()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pending
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"step {b1} failed" in (failed.value.details() or "")
    assert CLUSTER_B in (failed.value.details() or "")
    here = clusters.a.predictions(user)[a_before:]
    assert [(p["graph"]["step"], p["status"]) for p in here] == [(a1, "succeeded")]

    async def b_step_ended() -> bool:
        made = clusters.b.predictions(clusters.peer_on_b)[b_before:]
        return len(made) == 1 and made[0]["status"] == "succeeded"

    await until(b_step_ended, "cluster-456's step ending on its own, once", timeout=60)
    wait_for(
        lambda: registry_state(clusters.a.database_url)[CLUSTER_B][0] == "dead",
        "cluster-456 marked dead",
    )
    with pytest.raises(grpc.RpcError) as refused:
        call(clusters, B_BLOCKS[0], {"prompt": "x"})
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert "not alive" in refused.value.details()  # type: ignore[attr-defined]
    assert len(clusters.b.predictions(clusters.peer_on_b)) == b_before + 1
    clusters.b.start_gateway()
    wait_for(
        lambda: registry_state(clusters.a.database_url)[CLUSTER_B][0] == "alive",
        "cluster-456 alive again",
    )

    def routed_again() -> Any:
        try:
            return call(clusters, B_BLOCKS[0], {"prompt": "back"})
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            return None  # this gateway's view of the registry is up to cache_ttl old

    assert wait_for(routed_again, "cluster-456 routed to again") == {"got": {"prompt": "back"}}


# -- search (query_parameters) -----------------------------------------------------------------


def search_query(
    cluster: dict[str, Any], blocks: dict[str, Any], policy: str = "least-loaded"
) -> str:
    return json.dumps(
        {
            "body": {
                "values": {
                    "matchType": "cluster",
                    "rankingPolicyRule": {
                        "values": {
                            "executionMode": "code",
                            "policyRuleURI": policy,
                            "settings": {},
                            "parameters": {
                                "filterRule": {
                                    "matchType": "block",
                                    "filter": {"clusterQuery": cluster, "blockQuery": blocks},
                                }
                            },
                        }
                    },
                }
            }
        }
    )


def search(clusters: TwoClusters, query: str, session_id: str = "") -> Any:
    packet = BlockInferencePacket(
        session_id=session_id, data=json.dumps({"prompt": "q"}), query_parameters=query
    )
    with grpc.insecure_channel(clusters.a.address) as channel:
        answer = BlockInferenceServiceStub(channel).infer(
            packet, metadata=[("authorization", f"Bearer {clusters.user[1]}")], timeout=60
        )
    return json.loads(answer.data)


def kept_choices(clusters: TwoClusters, redis_url: str, session_id: str) -> list[Any]:
    """What the user's session kept of its searches (``session_id → block_id, connection``)."""
    engine = create_engine(
        clusters.a.database_url.replace("postgresql://", "postgresql+psycopg://")
    )
    try:
        with engine.connect() as conn:
            account_id = conn.execute(
                text("SELECT id FROM accounts WHERE name = :name"), {"name": clusters.user[0]}
            ).scalar_one()
    finally:
        engine.dispose()
    client = redis.Redis.from_url(redis_url)
    try:
        kept = client.hgetall(session_keys(account_id, session_id).route)
    finally:
        client.close()
    return [json.loads(v) for k, v in kept.items() if k.startswith(b"search:")]


async def test_the_seeds_search_example(
    clusters: TwoClusters, redis_url: str, tmp_path: Path, stubs: Path
) -> None:
    """Unmodified but for the address and a token: cluster-123's LLM blocks of GPT, ranked by
    the seed's policy (installed as a plugin): the highest priority one runs the task, and
    is kept for the session."""
    printed = await run_example("search.py", stubs, tmp_path, clusters.a.address, clusters.user[1])
    got = json.loads(printed["Data"])["got"]
    assert got["messages"][3] == {"role": "user", "content": "Tell me about black holes."}
    chosen = [k for k in kept_choices(clusters, redis_url, "sess-12345")]
    high = next(b for b, m in SEARCH_A.items() if m["priority"] == 5)
    assert chosen == [{"block_id": high, "cluster_id": CLUSTER_A, "url": clusters.a.address}]


def test_search_reaches_the_other_cluster(clusters: TwoClusters) -> None:
    on_b = len(clusters.b.predictions(clusters.peer_on_b))
    query = search_query(
        {"variable": "id", "operator": "IN", "value": [CLUSTER_B]},
        {"variable": "component.metadata.model", "operator": "LIKE", "value": "gpt-%"},
    )
    assert search(clusters, query) == {"got": {"prompt": "q"}}
    assert len(clusters.b.predictions(clusters.peer_on_b)) == on_b + 1


@pytest.mark.parametrize(
    ("cluster", "blocks", "policy", "code", "field"),
    [
        (
            {"variable": "id", "operator": "==", "value": "cluster-999"},
            {"variable": "component.metadata.algorithmType", "operator": "==", "value": "llm"},
            "least-loaded",
            grpc.StatusCode.NOT_FOUND,
            "filterRule.filter.clusterQuery",
        ),
        (
            {"variable": "id", "operator": "==", "value": CLUSTER_A},
            {"variable": "component.metadata.algorithmType", "operator": "==", "value": "asr"},
            "sticky",
            grpc.StatusCode.NOT_FOUND,
            "filterRule.filter.blockQuery",
        ),
        (
            {"variable": "id", "operator": "==", "value": CLUSTER_A},
            {"variable": "component.metadata.model", "operator": "~", "value": "x"},
            "random",
            grpc.StatusCode.INVALID_ARGUMENT,
            "filterRule.filter.blockQuery.operator",
        ),
        (
            {"variable": "id", "operator": "==", "value": CLUSTER_A},
            {"variable": "component.metadata.algorithmType", "operator": "==", "value": "llm"},
            "policies.unknown:v1",
            grpc.StatusCode.INVALID_ARGUMENT,
            "rankingPolicyRule.values.policyRuleURI",
        ),
    ],
)
def test_search_refusals_name_the_query(
    clusters: TwoClusters,
    cluster: dict[str, Any],
    blocks: dict[str, Any],
    policy: str,
    code: grpc.StatusCode,
    field: str,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        search(clusters, search_query(cluster, blocks, policy))
    assert refused.value.code() == code  # type: ignore[attr-defined]
    assert field in refused.value.details()  # type: ignore[attr-defined]


def test_the_quota_is_read_from_the_registry(clusters: TwoClusters) -> None:
    """An operator sets cluster-123's ``quota_management_data`` in its registry record; its
    gateway enforces it from its next heartbeat: the session's third task is over quota."""
    engine = create_engine(
        clusters.a.database_url.replace("postgresql://", "postgresql+psycopg://")
    )
    quota = "{inference_server_metadata,quota_management_data}"
    mine = "doc #>> '{inference_server_metadata,cluster_id}' = :c"
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"UPDATE inference_servers SET doc = jsonb_set(doc, '{quota}',"
                    f" CAST(:q AS jsonb)) WHERE {mine}"
                ),
                {"c": CLUSTER_A, "q": json.dumps({"requests_per_session_id": 2, "window": 60})},
            )

        def refused_third() -> bool:
            session = f"q-{uuid.uuid4().hex[:8]}"  # each try a session of its own
            codes = []
            for seq_no in (1, 2, 3):
                packet = BlockInferencePacket(
                    block_id=A_BLOCKS[0], session_id=session, seq_no=seq_no
                )
                codes.append(_code(clusters, packet))
            return codes == [
                grpc.StatusCode.OK,
                grpc.StatusCode.OK,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            ]

        wait_for(refused_third, "the registry's quota enforced")
    finally:
        with engine.begin() as conn:
            conn.execute(
                text(
                    f"UPDATE inference_servers SET doc = jsonb_set(doc, '{quota}', '{{}}')"
                    f" WHERE {mine}"
                ),
                {"c": CLUSTER_A},
            )
        engine.dispose()


def _code(clusters: TwoClusters, packet: BlockInferencePacket) -> grpc.StatusCode:
    with grpc.insecure_channel(clusters.a.address) as channel:
        try:
            BlockInferenceServiceStub(channel).infer(
                packet, metadata=[("authorization", f"Bearer {clusters.user[1]}")], timeout=60
            )
        except grpc.RpcError as error:
            return error.code()  # type: ignore[attr-defined, no-any-return]
    return grpc.StatusCode.OK
