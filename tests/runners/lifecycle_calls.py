"""For runner tests that call the lifecycle routes (load, unload, flush): operation tokens and
load-task polling."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from runners.optokens import issue
from tests.fixtures.waiting import until

KEY = b"k" * 32
SIGNERS = ["alice", "bob", "carol"]

Mint = Callable[..., str]


def configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str) -> Mint:
    """Configure the runner's environment for tokens (2 of 3 signers) and return a minting
    function: ``mint(operation, model=<model>, signers=None, key=KEY, now=None)``. Runners
    read the environment when they are created, so start them after this."""
    key_file = tmp_path / "op.key"
    key_file.write_bytes(KEY)
    monkeypatch.setenv("VERIFIED_OP_TOKEN_KEY_PATH", str(key_file))
    monkeypatch.setenv("OP_TOKEN_SIGNERS", ",".join(SIGNERS))
    monkeypatch.setenv("OP_TOKEN_MIN_SIGNERS", "2")

    def mint(
        operation: str, model: str | None = model, signers: list[str] | None = None, **kw: Any
    ) -> str:
        return issue(kw.get("key", KEY), operation, model, signers or SIGNERS[:2], kw.get("now"))

    return mint


async def wait_task(
    http: aiohttp.ClientSession, url: str, task_id: str, deadline: float = 10.0
) -> dict[str, Any]:
    """Poll ``GET /v1/models/load/<task_id>`` until the task completes or fails."""

    async def finished() -> dict[str, Any] | None:
        async with http.get(f"{url}/v1/models/load/{task_id}") as response:
            assert response.status == 200
            body: dict[str, Any] = await response.json()
        return body if body["status"] in ("completed", "failed") else None

    return await until(finished, f"load task {task_id}", deadline, interval=0.02)
