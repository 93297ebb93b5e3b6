"""What a runner says about itself (``GET /v1/capabilities``), as its callers read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import pydantic

from protocol.documents import CapabilitiesDocument

#: ``hardware`` of a runner that did not say what it runs on (a stock Cog server).
UNKNOWN_HARDWARE: Final = "runner"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a runner says about itself (read through
    :class:`protocol.documents.CapabilitiesDocument`); a stock Cog server says nothing, and is
    ``kind="cog"`` on unknown hardware."""

    kind: str = "cog"
    id: str | None = None
    hardware: str = UNKNOWN_HARDWARE
    #: Predictions it runs at once (Conduit's ``queue.slots``); None when it does not say.
    concurrency: int | None = None

    @classmethod
    def from_json(cls, body: Any) -> Capabilities:
        """A document that does not parse says nothing: a stock Cog server's."""
        try:
            document = CapabilitiesDocument.model_validate(body)
        except pydantic.ValidationError:
            return cls()
        return cls(
            document.runner_type or "conduit",
            document.runner_id,
            _hardware(document),
            _slots(document),
        )


def _slots(document: CapabilitiesDocument) -> int | None:
    slots = (document.queue.model_extra or {}).get("slots")
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 else None


def _hardware(document: CapabilitiesDocument) -> str:
    """Conduit's ``hardware``, else what the spec's ``resources.gpuIds`` imply when the runner
    reported its resources at all."""
    if document.hardware:
        return document.hardware
    if "resources" not in document.model_fields_set:
        return UNKNOWN_HARDWARE
    return "gpu" if document.resources.gpu_ids else "cpu"


STOCK_COG: Final = Capabilities()
