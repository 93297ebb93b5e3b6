"""Wire models of the public API's request bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from core.nesting import DEPTH_CEILING, MAX_DEPTH, check_depth

WebhookEventName = Literal["start", "output", "logs", "completed"]


class PredictionCreate(BaseModel):
    """Body of the three create endpoints. Unknown fields are ignored, as Replicate does."""

    model_config = ConfigDict(extra="ignore")

    version: str | None = Field(None, max_length=500)
    input: dict[str, Any]
    webhook: str | None = Field(None, max_length=4096)
    webhook_events_filter: list[WebhookEventName] | None = None
    #: Legacy field the official client still sends; treated as ``webhook`` with
    #: ``completed`` events only.
    webhook_completed: str | None = Field(None, max_length=4096)
    #: Deprecated by Replicate: every prediction has ``urls.stream``. Accepted and ignored.
    stream: bool | None = None

    @field_validator("version", "input", "webhook", "webhook_completed")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        check_storable(value, info.field_name or "body", DEPTH_CEILING)
        return value


def check_storable(value: Any, field: str, max_depth: int = MAX_DEPTH) -> None:
    """ValueError unless ``value`` nests at most ``max_depth`` deep (``core.nesting``, before
    anything walks it) and holds no NUL: Postgres text and jsonb cannot hold NUL; refused
    here, it never reaches a batched insert, where it would fail the rows committed with it."""
    check_depth(value, field, max_depth)
    if _has_nul(value):
        raise ValueError("must not contain NUL (\\u0000) characters")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False
