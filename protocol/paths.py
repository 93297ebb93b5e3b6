"""The runner contract's paths: Cog's, then the control API's (the runner API spec's)."""

from __future__ import annotations

from typing import Final

ROOT_PATH: Final = "/"
HEALTH_CHECK_PATH: Final = "/health-check"
OPENAPI_PATH: Final = "/openapi.json"
DOCS_PATH: Final = "/docs"
SHUTDOWN_PATH: Final = "/shutdown"
PREDICTIONS_PATH: Final = "/predictions"
PREDICTION_PATH: Final = "/predictions/{id}"
CANCEL_PATH: Final = "/predictions/{id}/cancel"
#: Cog's training endpoints (a trainer: ``cog.server.http --x-mode train``), alike otherwise.
TRAINING_PATH: Final = "/trainings/{id}"
TRAINING_CANCEL_PATH: Final = "/trainings/{id}/cancel"
CAPABILITIES_PATH: Final = "/v1/capabilities"
LOAD_PATH: Final = "/v1/models/load"
LOAD_TASK_PATH: Final = "/v1/models/load/{task_id}"
UNLOAD_PATH: Final = "/v1/models/unload"
CACHE_FLUSH_PATH: Final = "/v1/cache/flush"
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"
PROBE_PATHS: Final = frozenset({HEALTH_CHECK_PATH, HEALTH_PATH})
"""The health checks: ``GET`` answered without the runner token, so probes need no secret."""
