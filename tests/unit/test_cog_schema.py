"""``python -m conduit.cog_schema`` writes the schema ``cog build`` would: for each stock Cog
fixture model, what it prints is the ``.cog/openapi_schema.json`` committed beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("cog_model", ["predict.py:Predictor"]),
        ("cog_file_model", ["predict.py:Predictor"]),
        ("cog_trainer", ["predict.py:Predictor", "--train", "train.py:train"]),
    ],
)
def test_the_schema_is_the_one_cog_build_writes(model: str, args: list[str]) -> None:
    directory = FIXTURES / model
    done = subprocess.run(
        [sys.executable, "-m", "conduit.cog_schema", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    committed = json.loads((directory / ".cog" / "openapi_schema.json").read_text())
    assert json.loads(done.stdout) == committed


def test_a_reference_without_a_name_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conduit.cog_schema", "predict.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "expected FILE.py:NAME" in done.stderr
