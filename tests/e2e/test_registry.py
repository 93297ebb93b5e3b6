"""The registry of inference servers through a real api process: every request of the seed's
examples, run as the seed writes it (through ``curl`` when it is installed, a bearer token
added), with the answers it gets; admins only for writes, 404 for an unknown server, and a 400
naming each operator or path the registry cannot apply."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from conduit import admin as conduit_admin
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.curl import run_curl
from tests.fixtures.processes import Launcher

SEED_ID = "d4e8c3f0-7c8d-4a2e-b23e-2d4b6789abcd"

# The seed's examples, verbatim.
REGISTER = """curl -X POST <server-url>/inference_server \\
-H "Content-Type: application/json" \\
-d '{
"inference_server_name": "inference-server-us-east-1",
"inference_server_metadata": {
"region": "us-east-1",
"availability_zone": "us-east-1a",
"provider": "AWS",
"cluster_id": "cluster-123",
"quota_management_data": {
"requests_per_second_total": 100,
"requests_per_second_per_session": 10,
"requests_per_second_per_block_id": 10,
"requests_per_session_id": 1000,
"requests_per_block_id": 100
}
},
"inference_server_tags": ["NLP", "Transformer", "BERT"],
"inference_server_public_url": "https://us-east-1.inference.example.com"
}'"""
GET = "curl -X GET <server-url>/inference_server/d4e8c3f0-7c8d-4a2e-b23e-2d4b6789abcd"
SET_REGION = """curl -X PUT <server-url>/inference_server/d4e8c3f0-7c8d-4a2e-b23e-2d4b6789abcd \\
-H "Content-Type: application/json" \\
-d '{
"$set": {
"inference_server_metadata.region": "us-west-2",
"inference_server_metadata.provider": "Google Cloud"
}
}'"""
PUSH_TAG = """curl -X PUT <server-url>/inference_server/d4e8c3f0-7c8d-4a2e-b23e-2d4b6789abcd \\
-H "Content-Type: application/json" \\
-d '{
"$push": {
"inference_server_tags": "LLM"
}
}'"""
DELETE = "curl -X DELETE <server-url>/inference_server/d4e8c3f0-7c8d-4a2e-b23e-2d4b6789abcd"
IN_ZONE_WITH_GPU = """curl -X POST <server-url>/inference_servers \\
-H "Content-Type: application/json" \\
-d '{
"inference_server_metadata.availability_zone": "us-east-1a",
"inference_server_metadata.gpu_available": true
}'"""
ON_AWS = """curl -X POST <server-url>/inference_servers \\
-H "Content-Type: application/json" \\
-d '{
"inference_server_metadata.provider": "AWS"
}'"""
NLP_OR_LLM = """curl -X POST <server-url>/inference_servers \\
-H "Content-Type: application/json" \\
-d '{
"inference_server_tags": { "$in": ["NLP", "LLM"] }
}'"""
SINCE_2025 = """curl -X POST <server-url>/inference_servers \\
-H "Content-Type: application/json" \\
-d '{
"registered_at": { "$gte": "2025-01-01T00:00:00Z" }
}'"""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any


@dataclass(frozen=True)
class World:
    api_url: str
    admin_token: str
    user_token: str

    def client(self, token: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)

    def example(self, command: str, server_id: str = SEED_ID) -> Answer:
        """The seed's ``curl`` example against this api, with the admin's bearer token."""
        command = command.replace("<server-url>", self.api_url).replace(SEED_ID, server_id)
        return Answer(*run_curl(command, self.admin_token))


@pytest.fixture(scope="module")
def world(launcher: Launcher, admin: Admin) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:8]
    admin_token = admin._run(
        lambda engine: conduit_admin.create_account(engine, f"reg-admin-{suffix}", True)
    )
    user_token = admin.create_account(f"reg-user-{suffix}")
    proc, api_url = launcher.api()
    yield World(api_url, admin_token, user_token)
    proc.stop()


def _ids(answer: Answer) -> list[str]:
    assert answer.status == 200, answer.body
    assert set(answer.body) == {"results"}
    return [server["inference_server_id"] for server in answer.body["results"]]


def test_the_seeds_examples(world: World) -> None:
    registered = world.example(REGISTER)
    assert registered.status == 201, registered.body
    seed = registered.body
    server_id = seed["inference_server_id"]
    assert uuid.UUID(server_id).version == 4
    assert seed["inference_server_name"] == "inference-server-us-east-1"
    assert (
        seed["inference_server_metadata"]["quota_management_data"]["requests_per_block_id"] == 100
    )
    assert seed["inference_server_tags"] == ["NLP", "Transformer", "BERT"]
    assert seed["inference_server_public_url"] == "https://us-east-1.inference.example.com"
    assert seed["registered_at"] == seed["updated_at"]
    # Two more servers for the queries to tell apart.
    with world.client(world.admin_token) as http:
        gpu = http.post(
            "/inference_server",
            json={
                "inference_server_name": "gpu-east",
                "inference_server_metadata": {
                    "availability_zone": "us-east-1a",
                    "gpu_available": True,
                    "provider": "AWS",
                },
                "inference_server_tags": ["LLM"],
            },
        ).json()["inference_server_id"]
        gcp = http.post(
            "/inference_server",
            json={"inference_server_metadata": {"provider": "GCP"}, "inference_server_tags": []},
        ).json()["inference_server_id"]

    fetched = world.example(GET, server_id)
    assert fetched == Answer(200, seed)

    moved = world.example(SET_REGION, server_id)
    assert moved.status == 200, moved.body
    metadata = {**seed["inference_server_metadata"], "region": "us-west-2"}
    metadata["provider"] = "Google Cloud"
    assert moved.body["inference_server_metadata"] == metadata
    assert moved.body["updated_at"] > seed["updated_at"]
    assert moved.body["registered_at"] == seed["registered_at"]

    tagged = world.example(PUSH_TAG, server_id)
    assert tagged.status == 200, tagged.body
    assert tagged.body["inference_server_tags"] == ["NLP", "Transformer", "BERT", "LLM"]
    assert world.example(GET, server_id) == Answer(200, tagged.body)

    assert _ids(world.example(IN_ZONE_WITH_GPU)) == [gpu]
    assert _ids(world.example(ON_AWS)) == [gpu]  # the seed's server is on Google Cloud now
    assert _ids(world.example(NLP_OR_LLM)) == [server_id, gpu]
    # Other tests' servers (the clusters' gateways) are registered since 2025 too.
    ours = {server_id, gpu, gcp}
    assert [i for i in _ids(world.example(SINCE_2025)) if i in ours] == [server_id, gpu, gcp]

    assert world.example(DELETE, server_id) == Answer(204, None)
    missing = world.example(GET, server_id)
    assert missing.status == 404
    assert [i for i in _ids(world.example(SINCE_2025)) if i in ours] == [gpu, gcp]
    with world.client(world.admin_token) as http:
        for other in (gpu, gcp):
            assert http.delete(f"/inference_server/{other}").status_code == 204


@pytest.fixture
def server(world: World) -> Iterator[dict[str, Any]]:
    body = {
        "inference_server_name": "probe",
        "inference_server_metadata": {"region": "eu-west-1"},
        "inference_server_tags": ["CV"],
    }
    with world.client(world.admin_token) as http:
        created = http.post("/inference_server", json=body)
        assert created.status_code == 201, created.text
        assert created.headers["Location"].endswith(created.json()["inference_server_id"])
        yield created.json()
        http.delete(f"/inference_server/{created.json()['inference_server_id']}")


def test_only_admins_write(world: World, server: dict[str, Any]) -> None:
    path = f"/inference_server/{server['inference_server_id']}"
    with world.client(world.user_token) as http:
        assert_problem(http.post("/inference_server", json={}), 403)
        assert_problem(http.put(path, json={"$set": {"inference_server_name": "x"}}), 403)
        assert_problem(http.delete(path), 403)
        assert http.get(path).json() == server
        found = http.post("/inference_servers", json={"inference_server_name": "probe"})
        assert found.status_code == 200
        assert [s["inference_server_id"] for s in found.json()["results"]] == [
            server["inference_server_id"]
        ]
    with httpx.Client(base_url=world.api_url) as anonymous:
        assert_problem(anonymous.get(path), 401)


def test_unknown_server(world: World) -> None:
    path = f"/inference_server/{uuid.uuid4()}"
    with world.client(world.admin_token) as http:
        assert_problem(http.get(path), 404)
        assert_problem(http.put(path, json={"$set": {"inference_server_name": "x"}}), 404)
        assert_problem(http.delete(path), 404)


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"$foo": {"inference_server_name": "x"}}, "update.$foo"),
        ({"inference_server_name": "x"}, "update.inference_server_name"),
        ({"$set": {"inference_server_id": "x"}}, "update.$set.inference_server_id"),
        ({"$set": {"registered_at": "x"}}, "update.$set.registered_at"),
        ({"$set": {"owner": "x"}}, "update.$set.owner"),
        ({"$inc": {"inference_server_name": 1}}, "update.$inc.inference_server_name"),
        ({"$push": {"inference_server_tags": 5}}, "update.$push.inference_server_tags"),
        (
            {"$push": {"inference_server_tags": {"$sort": 1}}},
            "update.$push.inference_server_tags.$sort",
        ),
        # Refused by Postgres against the stored record: the region is a string.
        (
            {"$inc": {"inference_server_metadata.region": 1}},
            "update.$inc.inference_server_metadata.region",
        ),
    ],
)
def test_refused_updates(
    world: World, server: dict[str, Any], update: dict[str, Any], field: str
) -> None:
    path = f"/inference_server/{server['inference_server_id']}"
    with world.client(world.admin_token) as http:
        problem = assert_problem(http.put(path, json=update), 400)
        assert [e["field"] for e in problem["errors"]] == [field]
        assert problem["detail"].startswith(f"{field}: ")
        assert http.get(path).json() == server  # nothing stored


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"inference_server_metadata": {"$foo": 1}}, "filter.inference_server_metadata.$foo"),
        ({"$where": "1"}, "filter.$where"),
        ({"inference_server_tags": {"$in": "NLP"}}, "filter.inference_server_tags.$in"),
        ({"registered_at": {"$gte": "yesterday"}}, "filter.registered_at.$gte"),
        ([], "filter"),
    ],
)
def test_refused_queries(world: World, query: Any, field: str) -> None:
    with world.client(world.user_token) as http:
        problem = assert_problem(http.post("/inference_servers", json=query), 400)
    assert [e["field"] for e in problem["errors"]] == [field]
    assert field in problem["detail"]


def test_register_refuses_server_fields(world: World) -> None:
    with world.client(world.admin_token) as http:
        refused = http.post("/inference_server", json={"inference_server_id": SEED_ID})
        assert_problem(refused, 422)
        refused = http.post("/inference_server", json={"inference_server_tags": "NLP"})
        assert_problem(refused, 422)


def test_heartbeats_mark_servers_alive_then_dead(world: World, server: dict[str, Any]) -> None:
    """A server that never beat is ``registered``; a beat makes it ``alive`` for its grace; a
    beat of grace 0 (what a stopping gateway sends) marks it ``dead``, the record kept; each
    status is a filter."""
    server_id = server["inference_server_id"]
    path = f"/inference_server/{server_id}"
    assert server["status"] == "registered" and server["heartbeat_at"] is None

    def by_status(http: httpx.Client, status: str) -> bool:
        query = {"status": status, "inference_server_id": server_id}
        return [
            s["inference_server_id"]
            for s in http.post("/inference_servers", json=query).json()["results"]
        ] == [server_id]

    with world.client(world.admin_token) as http:
        alive = http.post(f"{path}/heartbeat", json={"grace": 3600}).json()
        assert alive["status"] == "alive" and alive["heartbeat_at"] is not None
        assert by_status(http, "alive") and not by_status(http, "dead")
        dead = http.post(f"{path}/heartbeat", json={"grace": 0}).json()
        assert dead["status"] == "dead"
        assert http.get(path).json()["status"] == "dead"
        assert by_status(http, "dead")
        assert_problem(http.post(f"{path}/heartbeat", json={"grace": -1}), 422)
        assert_problem(http.post(f"/inference_server/{uuid.uuid4()}/heartbeat"), 404)
        problem = assert_problem(http.post("/inference_servers", json={"status": "gone"}), 400)
        assert [e["field"] for e in problem["errors"]] == ["filter.status"]
    with world.client(world.user_token) as http:
        assert_problem(http.post(f"{path}/heartbeat"), 403)
