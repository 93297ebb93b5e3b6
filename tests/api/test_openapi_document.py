"""The OpenAPI document: problem+json errors, bearer security, the headers the routes read, and
response schemas that the renderers' bodies satisfy (the live check is tests/e2e/test_openapi.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from api.app import create_app
from api.errors import PROBLEM_JSON, problem_response
from api.routes.models import render_deployment, render_model, render_version
from api.settings import ApiSettings
from catalog.records import DeploymentInfo, ModelInfo, VersionInfo
from tracker.render import PredictionLinks, render_prediction
from tracker.states import Status

DOC = create_app(ApiSettings()).openapi()
OPERATIONS = [
    (method.upper(), path, operation)
    for path, item in DOC["paths"].items()
    for method, operation in item.items()
]
CREATES = [op for method, path, op in OPERATIONS if method == "POST" and path.endswith("ions")]
NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def validate(schema_name: str, body: Any) -> None:
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": DOC["components"]}
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    validator.validate(orjson.loads(orjson.dumps(body)))  # as it goes on the wire


def test_errors_are_problem_json_and_fastapi_validation_body_is_gone() -> None:
    assert "HTTPValidationError" not in DOC["components"]["schemas"]
    assert "ValidationError" not in DOC["components"]["schemas"]
    for method, path, operation in OPERATIONS:
        for status, response in operation["responses"].items():
            if path == "/health" or int(status) < 400:
                continue
            assert response["content"] == {
                PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}
            }, (method, path, status)
    assert set(DOC["components"]["schemas"]["Problem"]["required"]) == {
        "type",
        "title",
        "status",
        "detail",
    }


def test_v1_routes_need_the_bearer_token_and_health_does_not() -> None:
    assert DOC["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": DOC["components"]["securitySchemes"]["bearer"]["description"],
    }
    for method, path, operation in OPERATIONS:
        # The inference server registry and the request log keep the seed's own paths,
        # outside /v1.
        if path.startswith(("/v1/", "/inference_server", "/logs/")):
            # A stream's capability URL opens it without a token (``tracker.stream_urls``).
            anonymous: list[dict[str, Any]] = [{}] if path.endswith("/stream") else []
            assert operation["security"] == [{"bearer": []}, *anonymous], (method, path)
            assert {"401", "429"} <= set(operation["responses"]), (method, path)
        else:
            assert "security" not in operation


def test_creates_document_their_headers_and_the_stream_its_events() -> None:
    assert len(CREATES) == 3
    for operation in CREATES:
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert headers == {"Prefer", "Idempotency-Key", "Cancel-After", "X-Priority"}
        assert set(operation["responses"]) >= {"201", "400", "401", "409", "413", "422", "503"}
        created = operation["responses"]["201"]
        assert created["content"]["application/json"]["schema"]["$ref"].endswith("/Prediction")
    stream = DOC["paths"]["/v1/predictions/{prediction_id}/stream"]["get"]
    assert [p["name"] for p in stream["parameters"] if p["in"] == "header"] == ["Last-Event-ID"]
    assert [p["name"] for p in stream["parameters"] if p["in"] == "query"] == ["exp", "sig"]
    assert {"401", "403"} <= set(stream["responses"])
    assert set(stream["responses"]["200"]["content"]) == {"text/event-stream"}
    assert "itemSchema" in stream["responses"]["200"]["content"]["text/event-stream"]


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "p1",
        "model": "conduit/echo",
        "version_id": "a" * 64,
        "input": {"prompt": "hi"},
        "output": None,
        "logs": None,
        "error": None,
        "status": "starting",
        "created_at": NOW,
        "started_at": None,
        "completed_at": None,
        "metrics": None,
        "source": "api",
        "data_removed": False,
        "deployment": None,
        "deadline": None,
        "webhook": None,
        "webhook_events_filter": None,
    }
    return {**row, **changes}


@pytest.mark.parametrize(
    "row",
    [
        _row(),
        _row(deployment="conduit/echo", deadline=NOW, webhook="http://127.0.0.1/hook"),
        _row(webhook="http://127.0.0.1/hook", webhook_events_filter=["completed"]),
        *(
            _row(
                status=status.value,
                output=["a", {"b": 1}],
                logs="line\n",
                error="boom",
                started_at=NOW,
                completed_at=NOW,
                metrics={"predict_time": 0.5, "total_time": 1.0},
            )
            for status in Status
        ),
    ],
)
def test_rendered_predictions_match_the_prediction_schema(row: dict[str, Any]) -> None:
    prediction = render_prediction(row, PredictionLinks("http://127.0.0.1:8000"))
    validate("Prediction", prediction)
    validate("PredictionPage", {"next": None, "previous": "http://x/?c=1", "results": [prediction]})


def test_rendered_catalog_objects_match_their_schemas() -> None:
    version = VersionInfo("v" * 64, "conduit/echo", {"openapi": "3.0.2"}, None, 8, NOW, True)
    model = ModelInfo(1, "conduit", "echo", None, "public", version.id, NOW)
    deployment = DeploymentInfo(1, "conduit", "echo", "conduit/echo", version.id, 2, 8, 1800, NOW)
    validate("Version", render_version(version))
    validate("VersionPage", {"next": None, "previous": None, "results": [render_version(version)]})
    validate("Model", render_model(model, version, "http://127.0.0.1:8000"))
    validate("Model", render_model(model, None, "http://127.0.0.1:8000"))
    validate("Deployment", render_deployment(deployment, {}))


def test_problem_bodies_match_the_problem_schema() -> None:
    plain = problem_response(404, "Not found", "nothing here", instance="/v1/x")
    validate("Problem", orjson.loads(plain.body))
    fields = problem_response(422, "Invalid input", "bad", errors=[{"field": "a", "message": "b"}])
    validate("Problem", orjson.loads(fields.body))
