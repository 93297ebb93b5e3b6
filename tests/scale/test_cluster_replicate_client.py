"""The official Python ``replicate`` client against a stack on a Redis Cluster: the tests of
``tests/e2e/test_replicate_client.py``, imported with their ``client`` fixture."""

from __future__ import annotations

from tests.e2e.test_replicate_client import (
    client,
    test_create_get_wait_by_version_model_and_deployment,
    test_errors_surface_as_replicate_errors,
    test_list_and_cancel,
    test_model_and_version_objects,
    test_run_returns_full_output,
)

__all__ = [
    "client",
    "test_create_get_wait_by_version_model_and_deployment",
    "test_errors_surface_as_replicate_errors",
    "test_list_and_cancel",
    "test_model_and_version_objects",
    "test_run_returns_full_output",
]
