"""The runner API spec's (seed 004) example documents, and a check of answers against them.

:data:`EXAMPLES` holds the spec's JSON examples verbatim, in the order the spec gives them;
:func:`parse_spec` reads them out of the spec's text, so a test can tell the copy here from the
spec itself whenever the text is at hand (``CONDUIT_RUNNER_SPEC`` names it; by default the
shared docs' copy beside the repository).

:func:`conforms` checks an answer against an example: every field of the example is there, by
its name, with the JSON type of the example's value. Fields beyond the example's are allowed.
Where the runner honestly sends ``null`` (a figure it has not measured), the field's path is in
:data:`NULLABLE`; nowhere else is ``null`` accepted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EXAMPLES: dict[str, Any] = {
    "capabilities": {
        "runnerType": "vllm-0.6.0",
        "runnerId": "safebox-model-llm-1",
        "models": {
            "loaded": [
                {
                    "id": "meta-llama/Llama-3.1-70B-Instruct",
                    "quantization": "awq-4bit",
                    "contextLength": 32768,
                    "loadedAt": 1745880000,
                    "gpuMemoryMB": 24000,
                }
            ],
            "loading": [{"id": "mistralai/Mistral-7B-Instruct-v0.3", "progress": 0.45, "eta": 180}],
            "available": [
                "meta-llama/Llama-3.1-8B-Instruct",
                "deepseek-ai/deepseek-r1-distill-llama-70b",
            ],
        },
        "resources": {
            "gpuIds": [0],
            "gpuMemoryTotalMB": 81920,
            "gpuMemoryUsedMB": 58000,
            "gpuMemoryFreeMB": 23920,
            "gpuUtilization": 0.67,
            "kvCacheSizeMB": 12000,
            "kvCacheUtilization": 0.45,
        },
        "queue": {"depth": 3, "maxDepth": 16, "avgWaitMs": 150, "p95WaitMs": 450},
        "capabilities": {
            "streaming": True,
            "prefixCaching": True,
            "multiTenant": True,
            "visionInput": False,
            "audioInput": False,
            "functionCalling": True,
        },
        "health": "healthy",
    },
    "load_request": {
        "modelId": "meta-llama/Llama-3.1-70B-Instruct",
        "quantization": "awq-4bit",
        "maxContextLength": 32768,
        "gpuMemoryBudgetMB": 40000,
        "evictModel": "meta-llama/Llama-3.1-8B-Instruct",
        "verifiedOpToken": "eyJ...",
    },
    "load_accepted": {"taskId": "load-abc123", "status": "loading", "progress": 0.0, "eta": 300},
    "load_completed": {
        "taskId": "load-abc123",
        "status": "completed",
        "modelId": "meta-llama/Llama-3.1-70B-Instruct",
        "gpuMemoryUsedMB": 38500,
        "loadTimeMs": 287000,
    },
    "unload_request": {"modelId": "meta-llama/Llama-3.1-8B-Instruct", "verifiedOpToken": "eyJ..."},
    "unload": {
        "modelId": "meta-llama/Llama-3.1-8B-Instruct",
        "gpuMemoryFreedMB": 8200,
        "kvCacheFlushed": True,
    },
    "flush_request": {
        "scope": "tenant",
        "tenantId": "community-x",
        "modelId": None,
        "verifiedOpToken": "eyJ...",
    },
    "flush": {"flushed": True, "entriesRemoved": 1234, "memoryFreedMB": 3500},
    "health": {"status": "healthy", "uptime": 86400, "modelsLoaded": 2, "queueDepth": 3},
    "queue_full": {
        "error": {
            "code": "queue_full",
            "message": "Queue depth 16/16, retry in 5 seconds",
            "queueDepth": 16,
            "avgWaitMs": 2000,
        }
    },
    "rate_limited": {
        "error": {
            "code": "rate_limit_exceeded",
            "message": "Tenant community-x exceeded 100 req/min",
            "limit": 100,
            "remaining": 0,
            "resetAt": 1745880060,
        }
    },
    "op_token": {
        "opToken": {
            "operation": "model-load",
            "modelId": "meta-llama/Llama-3.1-70B-Instruct",
            "issuedAt": 1745880000,
            "signers": ["admin1", "admin2", "admin3"],
            "nonce": "abc123...",
        },
        "signature": "...",
    },
}

LOAD_FAILED: dict[str, Any] = {
    "taskId": "load-abc123",
    "status": "failed",
    "modelId": "meta-llama/Llama-3.1-70B-Instruct",
    "error": "...",
}
"""A failed task: the spec gives no example, but its poller reads ``status.error``."""

NULLABLE: dict[str, frozenset[str]] = {
    "capabilities": frozenset(
        {
            # not every model has them (echo has neither)
            "$.models.loaded[].quantization",
            "$.models.loaded[].contextLength",
            # seconds left from the last load's duration: unknown before one finished
            "$.models.loading[].eta",
            # figures a GPU driver may not give
            "$.resources.gpuMemoryTotalMB",
            "$.resources.gpuMemoryUsedMB",
            "$.resources.gpuMemoryFreeMB",
            "$.resources.gpuUtilization",
            "$.resources.kvCacheSizeMB",
            "$.resources.kvCacheUtilization",
        }
    ),
    "load_accepted": frozenset({"$.eta"}),
    "flush": frozenset({"$.memoryFreedMB"}),  # a model that cannot measure its caches
}

SPEC_ENV = "CONDUIT_RUNNER_SPEC"
SHARED_SPEC = Path(__file__).resolve().parents[3] / "shared/seeds/004_5fbc0baec2725cce.txt"


def spec_text() -> str | None:
    """The spec's text, when ``CONDUIT_RUNNER_SPEC`` (or the shared docs' copy) is there."""
    path = Path(os.environ.get(SPEC_ENV) or SHARED_SPEC)
    return path.read_text() if path.is_file() else None


def parse_spec(text: str) -> dict[str, Any]:
    """The spec's JSON examples (each a block from a line ``{`` to a line ``}``), named in
    the order :data:`EXAMPLES` gives."""
    blocks: list[Any] = []
    lines: list[str] | None = None
    for line in text.splitlines():
        if lines is None and line.strip() == "{" and not line.startswith(" "):
            lines = [line]
        elif lines is not None:
            lines.append(line)
            if line.rstrip() == "}":
                blocks.append(json.loads("\n".join(lines)))
                lines = None
    if len(blocks) != len(EXAMPLES):
        raise ValueError(f"expected {len(EXAMPLES)} JSON examples, found {len(blocks)}")
    return dict(zip(EXAMPLES, blocks, strict=True))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_ACCEPTS = {"number": {"number", "integer"}}


def conforms(
    value: Any, example: Any, nullable: frozenset[str] = frozenset(), where: str = "$"
) -> list[str]:
    """Where ``value`` departs from ``example``; empty when it conforms."""
    want, got = _kind(example), _kind(value)
    if want == "null" or (got == "null" and where in nullable):
        return []
    if got not in _ACCEPTS.get(want, {want}):
        return [f"{where}: {value!r} is not {want}"]
    if want == "array":
        return [
            issue
            for item in (value if example else [])
            for issue in conforms(item, example[0], nullable, f"{where}[]")
        ]
    if want != "object":
        return []
    issues = [f"{where}.{key}: missing" for key in example if key not in value]
    for key, inner in example.items():
        if key in value:
            issues += conforms(value[key], inner, nullable, f"{where}.{key}")
    return issues


def check(name: str, value: Any) -> list[str]:
    """Where ``value`` departs from the spec's example ``name``."""
    example = LOAD_FAILED if name == "load_failed" else EXAMPLES[name]
    return conforms(value, example, NULLABLE.get(name, frozenset()))
