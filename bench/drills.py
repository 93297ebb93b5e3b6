"""The fault and scale-out drills at their full size, with their table of outcomes.

``.venv/bin/python -m bench.drills [pytest arguments]``

The test suite runs each drill at a bounded size (``tests/fixtures/sizing.py``) to fit CI's
budget; this runs ``tests/faults`` and ``tests/scale`` with ``CONDUIT_DRILL_SIZE=full``, one
drill after another in one process, and pytest prints the drills' table at the end (submitted,
terminal, lost, duplicate runs and how each was explained, seconds). Extra arguments go to
pytest (``-k director_kills`` for one drill).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.sizing import SIZE_ENV

ROOT = Path(__file__).resolve().parents[1]
DRILLS = ["tests/faults", "tests/scale"]


def main(argv: list[str]) -> int:
    env = {**os.environ, SIZE_ENV: "full"}
    command = [sys.executable, "-m", "pytest", "-n0", "-p", "no:cacheprovider", "-q"]
    return subprocess.call([*command, *DRILLS, *argv], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
