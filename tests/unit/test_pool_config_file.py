"""The pool's configuration file as the docs document it: its YAML example is read by a
default install, with no extra to install first."""

from __future__ import annotations

import re
from importlib.metadata import requires
from pathlib import Path

from runners.pool.config_file import load, parse_size

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "model-pool.md"


def _pool_example() -> str:
    """The first ``yaml`` block of the model pool page's "Running a pool" section."""
    text = PAGE.read_text()
    section = text[text.index("## Running a pool") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the pool page's section has no yaml example"
    return match[1]


def test_the_documented_yaml_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(_pool_example())
    file = load(path)
    assert file.budget == parse_size("24GiB")
    assert [m.name for m in file.models] == ["small", "llm", "legacy", "llm-tuned"]
    llm = file.models[1]
    assert llm.pinned and llm.backend.conduit == "vllm" and llm.load_timeout == 600
    assert file.models[2].backend.cog is not None
    assert "COG_WEIGHTS" not in file.models[2].backend.cog.environment()
    tuned = file.models[3].backend.cog
    assert tuned is not None and tuned.weights is not None
    assert tuned.environment()["COG_WEIGHTS"] == tuned.weights


def test_the_yaml_parser_is_a_base_dependency() -> None:
    """A default install (no extras) can read the documented YAML format."""
    base = [r for r in requires("conduit") or [] if "extra ==" not in r]
    assert any(re.match(r"pyyaml\b", r, re.IGNORECASE) for r in base), base
    assert "needs PyYAML" not in PAGE.read_text()
