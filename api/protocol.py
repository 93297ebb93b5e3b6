"""Wire models of the public API's request bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
