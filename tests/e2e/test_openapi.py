"""The OpenAPI document tells the truth: schemathesis drives a live api from its own
``/openapi.json`` and checks every answer against it (no server errors, only documented status
codes and content types, bodies that match their schemas).

Each operation gets a bounded number of generated requests, valid and invalid, derandomized so
a run is repeatable. Path parameters are generated, and also pinned to what exists (the echo
deployment, its version, a finished prediction) so the success bodies are checked too. Creates
on the echo deployment send a fixed small input: generated ones could tie up the shared runner.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from api.settings import ApiSettings
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status

pytestmark = pytest.mark.e2e

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
#: Generated requests per operation and generation mode.
EXAMPLES = 25

OPERATIONS = [
    (method.upper(), path)
    for path, item in create_app(ApiSettings()).openapi()["paths"].items()
    for method in item
]


@pytest.fixture(scope="module")
def schema(stack: Stack) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(
        f"{stack.api_url}/openapi.json", config=schemathesis.Config(), timeout=10
    )


@pytest.fixture(scope="module")
def existing(stack: Stack, admin: Admin) -> dict[str, Any]:
    """Path parameters that name real things, and the token of the account that owns them."""
    token = admin.create_account("openapi-conformance")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as client:
        created = create(client, f"/v1/deployments/{ECHO}/predictions", input={"prompt": "doc"})
        wait_status(client, created["id"])
    owner, name = ECHO.split("/")
    return {
        "token": token,
        "path": {
            "owner": owner,
            "name": name,
            "version_id": stack.version,
            "prediction_id": created["id"],
        },
    }


def test_served_document_is_the_app_document(stack: Stack) -> None:
    served = httpx.get(f"{stack.api_url}/openapi.json").json()
    assert served == create_app(ApiSettings()).openapi()


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_operation_conforms_to_document(
    schema: schemathesis.BaseSchema,
    existing: dict[str, Any],
    stack: Stack,
    method: str,
    path: str,
) -> None:
    operation = schema[path][method]
    names = {p.name for p in operation.path_parameters}
    pinned = {k: v for k, v in existing["path"].items() if k in names}
    body: dict[str, Any] = {}
    if method == "POST" and path.endswith(("/predictions", "/run")) and pinned:
        body["body"] = {"input": {"prompt": "generated"}}
    strategies = [
        operation.as_strategy(generation_mode=mode)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    if pinned:
        strategies += [
            operation.as_strategy(generation_mode=mode, path_parameters=pinned, **body)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    auth = {"Authorization": f"Bearer {existing['token']}"}

    @settings(
        max_examples=EXAMPLES * len(strategies),
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies))
    def conforms(case: schemathesis.Case[Any]) -> None:
        case.call_and_validate(base_url=stack.api_url, headers=auth, checks=CHECKS, timeout=30)

    conforms()


def test_last_event_id_past_the_stream_is_refused(stack: Stack, existing: dict[str, Any]) -> None:
    """Found by the run above: an id past a finished prediction's last event used to hold the
    stream open for ever, and one beyond 64 bits broke it after its headers."""
    prediction = existing["path"]["prediction_id"]
    auth = {"Authorization": f"Bearer {existing['token']}"}
    url = f"{stack.api_url}/v1/predictions/{prediction}/stream"
    for last in ("695443531928573017-701", "08720-94272627789230833747942649198339"):
        response = httpx.get(url, headers={**auth, "Last-Event-ID": last}, timeout=30)
        assert_problem(response, 400)
    first = httpx.get(url, headers={**auth, "Last-Event-ID": "0-1"}, timeout=30)
    assert first.status_code == 200
    assert "event: done" in first.text


def test_values_postgres_cannot_store_are_refused(stack: Stack, existing: dict[str, Any]) -> None:
    """A NUL character used to reach Postgres and come back as 503 "database unreachable"."""
    auth = {"Authorization": f"Bearer {existing['token']}"}
    with httpx.Client(base_url=stack.api_url, headers=auth, timeout=30) as client:
        for path in ("/v1/predictions/%00", f"/v1/deployments/{ECHO}%00", "/v1/models/%00/x"):
            assert_problem(client.get(path), 400)
        nul_input = {"input": {"prompt": "a\u0000"}}
        body = assert_problem(
            client.post(f"/v1/deployments/{ECHO}/predictions", json=nul_input), 422
        )
        assert body["errors"][0]["field"] == "input"
