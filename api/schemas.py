"""Wire models of the public API's response bodies, for the OpenAPI document.

The routes render their bodies themselves (``tracker.render``, ``api.routes.models``, …) and
return them as responses, so these models never touch a request: they describe, field for
field, what those renderers send. A field that may be absent is optional here; one that may be
``null`` is nullable; one that is never ``null`` when present is not (``SkipJsonSchema`` keeps
the ``None`` default out of the schema).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from api.protocol import WebhookEventName


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _absent(description: str | None = None) -> Any:
    """A field that is left out, never sent as ``null``: optional, and not nullable."""
    return Field(None, description=description, json_schema_extra=_drop_default)


#: The values of :class:`tracker.states.Status`.
PredictionStatus = Literal["starting", "processing", "succeeded", "failed", "canceled", "aborted"]


class ProblemError(BaseModel):
    field: str = Field(description="The field, header or body path at fault.")
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem detail: the body of every error response."""

    type: str = Field(description='Always "about:blank": the status and title say it all.')
    title: str
    status: int = Field(description="The HTTP status code, repeated.")
    detail: str = Field(description="What went wrong with this request, for a person.")
    instance: str | SkipJsonSchema[None] = _absent("The request's path.")
    code: str | SkipJsonSchema[None] = _absent(
        "A stable name of the problem, where one helps a program react: rate_limited, "
        "invalid_signature, expired_signature."
    )
    errors: list[ProblemError] | SkipJsonSchema[None] = _absent(
        "Each field at fault, when the problem is about fields."
    )


class PredictionUrls(BaseModel):
    get: str
    cancel: str
    stream: str = Field(description="Server-sent events of the prediction's output and logs.")


class _Job(BaseModel):
    """What a prediction and a training share (``tracker.render``)."""

    id: str
    model: str = Field(description="owner/name of the model.")
    version: str = Field(description="The version id.")
    input: dict[str, Any]
    output: Any = Field(description="The model's output: null until it produces some.")
    logs: str
    error: str | None
    status: PredictionStatus
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    urls: PredictionUrls
    metrics: dict[str, Any] = Field(
        description="Times the runner reported, in seconds: predict_time, and when known "
        "queue_wait_time and gpu_time."
    )
    source: str
    data_removed: bool
    webhook: str | SkipJsonSchema[None] = _absent()
    webhook_events_filter: list[WebhookEventName] | None = Field(
        None, description="Present with webhook; null means every event."
    )


class Prediction(_Job):
    """A prediction, as every endpoint and webhook renders it (``tracker.render``)."""

    deployment: str | SkipJsonSchema[None] = _absent(
        "owner/name of the deployment, for a deployment's prediction."
    )
    deadline: datetime | SkipJsonSchema[None] = _absent(
        "When it is canceled, or aborted if not yet started (Cancel-After)."
    )


class Training(_Job):
    """A training (``/v1/trainings``): a job on the queue that makes a new version of
    ``destination`` from ``version`` and the weights it trains."""

    model: str = Field(description="owner/name of the model trained.")
    version: str = Field(description="The version trained.")
    destination: str = Field(description="owner/name of the model that gets the new version.")
    output: Any = Field(
        description="On success: `version`, the destination's new version, and `weights`, the "
        "URL of the trained weights."
    )


class TrainingPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Training]


class Account(BaseModel):
    type: Literal["user", "organization"]
    username: str
    name: str
    github_url: str | None


class PredictionPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Prediction]


class Version(BaseModel):
    id: str
    created_at: datetime
    cog_version: str
    openapi_schema: dict[str, Any]


class VersionPage(BaseModel):
    next: str | None
    previous: str | None
    results: list[Version]


class Model(BaseModel):
    url: str
    owner: str
    name: str
    description: str | None
    visibility: str
    hardware: str | None = Field(description="The hardware class it is meant to run on.")
    github_url: str | None
    paper_url: str | None
    license_url: str | None
    run_count: int
    cover_image_url: str | None
    default_example: dict[str, Any] | None
    latest_version: Version | None


class ModelPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Model]


class DeploymentConfiguration(BaseModel):
    hardware: str = Field(
        description="A hardware class of the fleet (`GET /v1/hardware`); `unknown` for a "
        "deployment that names none and whose runners do not say."
    )
    min_instances: int = Field(description="Fewest directors the Kubernetes kit keeps.")
    max_instances: int = Field(description="Most directors the Kubernetes kit scales to.")
    shards: int
    prediction_timeout: float = Field(description="Seconds a prediction may run.")


class DeploymentRelease(BaseModel):
    number: int
    model: str
    version: str
    created_at: datetime
    created_by: Account | None = Field(description="Who made this release; null: the operator.")
    configuration: DeploymentConfiguration


class Deployment(BaseModel):
    owner: str
    name: str
    current_release: DeploymentRelease
    withdrawn: str | None = Field(
        None,
        description="Why the deployment takes no predictions: its model's owner made the model"
        " private to the deployment's owner, or deleted the version it runs. Null: it runs.",
    )


class DeploymentPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Deployment]


class UsageTotals(BaseModel):
    predictions: int
    predict_time: float
    gpu_time: float
    cpu_time: float
    billable_seconds: float


class DeployableUsage(UsageTotals):
    deployable: str = Field(description="owner/name of the deployment, or of the model.")


class Usage(UsageTotals):
    start: str | None = Field(description="The start asked for, as parsed; null for none.")
    end: str | None = Field(description="The end asked for, as parsed; null for none.")
    by_deployable: list[DeployableUsage]


class WebhookSecret(BaseModel):
    key: str = Field(description="The Standard Webhooks signing secret, whsec_...")


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(description='Each dependency: "ok" or "error: <kind>".')
