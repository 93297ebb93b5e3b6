"""What the front door is configured by: read once per process by every entry, so one setting
changes a rule for the REST routes, ``/run`` and the gateway alike."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.nesting import DEPTH_CEILING, MAX_DEPTH


class AdmissionSettings(BaseSettings):
    """What every entry admits, the same for the REST routes, ``/run`` and the gateway
    (``CONDUIT_*``; the names the api and the gateway each had before are read too)."""

    model_config = SettingsConfigDict(env_prefix="CONDUIT_", extra="ignore")

    #: Deepest nesting accepted in an input (a prediction's ``input``, a task's ``data``; the
    #: object itself is level 1); deeper inputs are refused naming the field.
    max_input_depth: int = Field(
        MAX_DEPTH,
        ge=1,
        le=DEPTH_CEILING,
        validation_alias=AliasChoices(
            "CONDUIT_MAX_INPUT_DEPTH",
            "CONDUIT_API_MAX_INPUT_DEPTH",
            "CONDUIT_GATEWAY_MAX_INPUT_DEPTH",
        ),
    )
