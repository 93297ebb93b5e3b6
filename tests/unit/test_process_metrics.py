"""Metrics are objects per process, each with a registry of its own: no module of the product
holds a registry or a metric, and nothing lands in prometheus_client's global registry."""

from __future__ import annotations

import importlib
import pkgutil

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from api.metrics import ApiMetrics
from core.metrics import ProcessMetrics
from director.metrics import DirectorMetrics
from runners.metrics import RunnerMetrics
from runners.pool.metrics import PoolMetrics

PRODUCT = [
    "core",
    "protocol",
    "runners",
    "tracker",
    "catalog",
    "files",
    "blocks",
    "front",
    "lane",
    "director",
    "api",
    "gateway",
]


def _modules() -> list[str]:
    names = []
    for package in PRODUCT:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.startswith("runners.models.vllm"):
                continue  # the engine's own (global) registry is read, never written
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_no_module_holds_a_registry_or_a_metric(name: str) -> None:
    module = importlib.import_module(name)
    held = [
        attr
        for attr, value in vars(module).items()
        if isinstance(value, (CollectorRegistry, MetricWrapperBase))
    ]
    assert held == [], f"{name} holds {held}"


def test_nothing_of_conduit_in_the_global_registry() -> None:
    _modules()  # every product module imported
    names = [
        metric.name
        for metric in prometheus_client.REGISTRY.collect()
        if metric.name.startswith(("conduit_", "lane_"))
    ]
    assert names == []


def test_every_process_keeps_its_own_registry() -> None:
    assert all(
        issubclass(kind, ProcessMetrics)
        for kind in (ApiMetrics, DirectorMetrics, RunnerMetrics, PoolMetrics)
    )
    first, second = DirectorMetrics(), DirectorMetrics()
    first.reclaimed.inc()
    assert b"conduit_director_reclaimed_total 1.0" in first.exposition()
    assert b"conduit_director_reclaimed_total 0.0" in second.exposition()
    one, other = RunnerMetrics(), RunnerMetrics()
    assert one.registry is not other.registry
