"""A director started for a deployment that does not exist (a trainer director for a model
no deployment runs, a typo) exits at once with one clear line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.fixtures.processes import base_env


@pytest.mark.parametrize("job_kind", ["training", "prediction"])
def test_a_director_without_its_deployment_exits_with_one_line(
    database_url: str, redis_url: str, job_kind: str
) -> None:
    name = f"nobody-{uuid.uuid4().hex[:8]}/base"
    env = {**base_env(database_url, redis_url), "CONDUIT_DIRECTOR_JOB_KIND": job_kind}
    done = subprocess.run(
        [sys.executable, "-m", "conduit", "director", "--deployment", name,
         "--runner-url", "http://127.0.0.1:9"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and "LookupError" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"conduit director: deployment {name} does not exist"), lines
    assert "create-deployment" in lines[0]
    if job_kind == "training":
        assert "trainer director" in lines[0]
