"""The gateway on a 3-master Redis Cluster: the same tests as on one Redis (imported, not
copied), against a live gateway whose event reader, sessions and route cache run with a
``redis+cluster://`` URL. Sessions' keys carry one hash tag each, so their scripts name one
slot; predictions' event streams spread over the nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live, live_fixture
from tests.fixtures.processes import Launcher
from tests.gateway.test_execution import (
    stub,
    test_a_client_that_cancels_its_call_cancels_the_prediction,
    test_a_failed_prediction_is_aborted_with_the_models_error,
    test_a_session_pair_runs_once_and_replays_its_answer,
    test_a_task_runs_as_a_prediction_and_answers_its_output,
    test_files_reach_the_model_as_files,
    test_invalid_input_names_the_field_and_queues_nothing,
    test_tasks_of_a_session_run_in_seq_no_order,
)
from tests.gateway.test_graph_live import (
    test_a_failed_step_fails_the_graph_naming_it,
    test_fan_out_and_fan_in,
)

__all__ = [
    "stub",
    "test_a_client_that_cancels_its_call_cancels_the_prediction",
    "test_a_failed_prediction_is_aborted_with_the_models_error",
    "test_a_failed_step_fails_the_graph_naming_it",
    "test_a_session_pair_runs_once_and_replays_its_answer",
    "test_a_task_runs_as_a_prediction_and_answers_its_output",
    "test_fan_out_and_fan_in",
    "test_files_reach_the_model_as_files",
    "test_invalid_input_names_the_field_and_queues_nothing",
    "test_tasks_of_a_session_run_in_seq_no_order",
]


@pytest.fixture(scope="module")
def live(stack: Stack, launcher: Launcher, admin: Admin, redis_url: str) -> Iterator[Live]:
    yield from live_fixture(stack, launcher, admin, redis_url)
