"""Conformance: NVIDIA's unmodified ``tritonclient`` against the gateway's Open Inference
Protocol. The client needs protobuf < 7, so it lives in its own environment (``.venv-triton``,
made by ``scripts/bootstrap``) and runs as a subprocess (``triton_client.py``) against a
gateway served in the test's loop, whose models are blocks of the test database."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import writes
from catalog.records import Visibility
from gateway.server import Gateway
from tests.fixtures.admin import Admin
from tests.gateway.test_protos import OIP

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-triton" / "bin" / "python"
CLIENT = Path(__file__).with_name("triton_client.py")
SCHEMA: dict[str, Any] = {
    "components": {
        "schemas": {
            "Input": {
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "x-order": 0},
                    "ids": {"type": "array", "items": {"type": "integer"}, "x-order": 1},
                },
            },
            "Output": {"type": "array", "items": {"type": "string"}},
        }
    }
}

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(),
    reason="tritonclient's environment .venv-triton is missing: run scripts/bootstrap",
)


async def run_client(address: str, token: str, model: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(PYTHON),
        str(CLIENT),
        address,
        token,
        model,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    got: dict[str, Any] = json.loads(out)
    return got


@pytest.fixture
async def block(engine: AsyncEngine, admin: Admin) -> tuple[str, str, str]:
    """A private deployment's block: its id, its version and its owner's token."""
    owner = f"triton-{uuid.uuid4().hex[:10]}"
    token = admin.create_account(owner)
    version = await writes.create_version(engine, owner, "llm", SCHEMA, None, 2, Visibility.PRIVATE)
    admin.create_deployment(f"{owner}/llm-run", f"{owner}/llm", version=version, shards=2)
    return admin.create_block(f"{owner}/llm-run"), version, token


async def test_tritonclient(gateway: Gateway, block: tuple[str, str, str]) -> None:
    model, version, token = block
    got = await run_client(f"127.0.0.1:{gateway.port}", token, model)

    # The wire: tritonclient's own stubs are ours, field for field.
    assert got["descriptor"] == {
        name: {field: list(spec) for field, spec in fields.items()} for name, fields in OIP.items()
    }

    assert got["live"] is True and got["ready"] is True
    assert got["server"]["name"] == "conduit"
    assert sorted(got["server"]["extensions"]) == ["parameters", "sequence"]
    assert got["model_ready"] is True
    assert got["model"] == {
        "name": model,
        "versions": [version],
        "platform": "cog",
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": ["1"]},
            {"name": "ids", "datatype": "INT64", "shape": ["-1"]},
        ],
        "outputs": [{"name": "output", "datatype": "BYTES", "shape": ["-1"]}],
    }

    infer = got["infer"]
    assert (infer["id"], infer["model_name"]) == ("r-1", model)
    assert infer["data"] == {
        "ids": [1, -2, 2**40],
        "scale": 0.5,
        "grid": [[1.0, 2.0], [3.0, 4.0]],
        "prompt": "héllo",
        "words": ["a", "b"],
    }
    assert infer["data_content_type"] == "json"
    assert infer["block_id"] == [model]
    assert infer["seq_no"] == [0]
    assert infer["has_deadline"] == [True]
    assert (infer["ts_dtype"], infer["seq_no_dtype"]) == ("float64", "int64")

    assert got["wrong_token"]["status"] == "StatusCode.UNAUTHENTICATED"
    assert got["bad_tensor"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert got["bad_tensor"]["message"] == "input 'ids': given twice"

    # One response per item, as the task yields them, the empty last one flagged; the other
    # requests of the sequence reach the executor as session "7", seq_no 2 and 3.
    assert got["stream"] == [
        {"id": "s-1", "output": ["tok1"], "final": False},
        {"id": "s-1", "output": ["tok2"], "final": False},
        {"id": "s-1", "output": ["tok3"], "final": False},
        {"id": "s-1", "final": True},
        {"id": "s-2", "session_id": ["7"], "seq_no": [2]},
        {"id": "s-3", "session_id": ["7"], "seq_no": [3]},
    ]
