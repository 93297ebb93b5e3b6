"""Build the project's wheel from a copy of the tree, as a user's ``pip wheel .`` would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def build_wheel(tmp_path: Path) -> Path:
    """Build from a copy of the files git sees (not ignored ones), so the tree gets no build/
    or egg-info."""
    source = tmp_path / "source"
    tracked = run(
        "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT
    ).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    dist = tmp_path / "dist"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", source, "-w", dist)
    (wheel,) = dist.glob("conduit-*.whl")
    return wheel
