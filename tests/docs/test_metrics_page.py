"""The metrics reference is generated (``conduit.metrics_doc``, an mkdocs hook): it names every
metric of every process's registry, so a metric added to a process cannot be left out, and the
collectors that read live objects at a scrape describe exactly the families they yield."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any, cast

import yaml
from prometheus_client.core import Metric
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import create_async_engine

from api.deps import Resources
from api.metrics import ResourceCollector
from conduit import metrics_doc
from conduit.settings_catalog import ROOT
from lane.core_records import LaneCounters
from lane.events import RejectReason
from lane.metrics import LaneCollector
from runners.pool.config import FixedProbe, ModelSpec, PoolConfig
from runners.pool.core import PoolCore
from runners.pool.metrics import PoolCollector
from runners.pool.state import Pool

PAGE = ROOT / "docs" / "reference" / "metrics.md"
#: Series prometheus_client derives from a family's name.
SERIES = ("_total", "_created", "_bucket", "_sum", "_count")


def _sections() -> dict[str, str]:
    sections = {}
    for part in metrics_doc.render().split("## ")[1:]:
        title, _, body = part.partition("\n")
        sections[title] = body
    return sections


def test_the_page_carries_the_marker_and_mkdocs_fills_it() -> None:
    assert metrics_doc.MARKER in PAGE.read_text()
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "conduit/metrics_doc.py" in config["hooks"]
    filled = metrics_doc.on_page_markdown(PAGE.read_text())
    assert metrics_doc.MARKER not in filled
    assert "`conduit_director_inflight`" in filled


def test_the_page_names_every_metric_of_every_process() -> None:
    sections = _sections()
    assert list(sections) == [process.title for process in metrics_doc.PROCESSES]
    for process in metrics_doc.PROCESSES:
        section = sections[process.title]
        # The names the registry itself derives from its collectors (each counter's
        # ``_total``, each histogram's ``_bucket``...): every one is on the page.
        names = list(process.registry()._names_to_collectors)
        assert names, process.title
        for name in names:
            stems = [name] + [name.removesuffix(s) for s in SERIES if name.endswith(s)]
            assert any(f"`{stem}`" in section or f"`{stem}_total`" in section for stem in stems), (
                f"{name} ({process.title}) is missing from the metrics reference"
            )


def test_a_row_gives_the_exposed_name_type_labels_and_help() -> None:
    api = _sections()["api"]
    assert (
        "| `conduit_api_requests_total` | counter | `method`, `route`, `status` | "
        "HTTP requests answered, by method, route template and status. |"
    ) in api
    assert "| `lane_rejections_total` | counter | `deployment`, `reason` |" in api
    gateway = _sections()["gateway"]
    assert "| `conduit_gateway_quota_refusals_total` | counter | `limit`, `mode` |" in gateway


def _same_families(described: Iterable[Metric], collected: Iterable[Metric]) -> None:
    described = list(described)
    collected = list(collected)
    assert collected, "the stand-in yields nothing to compare"
    assert [(m.name, m.type, m.documentation) for m in described] == [
        (m.name, m.type, m.documentation) for m in collected
    ]
    for description, family in zip(described, collected, strict=True):
        labels = set(cast(Any, description)._labelnames) | {"le"}
        for sample in family.samples:
            assert set(sample.labels) <= labels, (family.name, sample.labels)


def test_the_lane_collector_describes_what_it_collects() -> None:
    counters = LaneCounters(1, 2, 3, 4, 5, {RejectReason.EXPIRED: 1}, 0, 6, 7)
    lane = SimpleNamespace(snapshot=lambda: {"a": counters}, records_written=8, record_failures=9)
    collector = LaneCollector(lambda: lane)
    _same_families(collector.describe(), collector.collect())


def test_the_api_resource_collector_describes_every_gauge_it_may_collect() -> None:
    resources = SimpleNamespace(
        hub=SimpleNamespace(waiters=1, max_waiters=2),
        engine=create_async_engine("postgresql+psycopg://"),  # never connects
        redis=Redis(),  # never connects
    )
    collector = ResourceCollector(lambda: cast(Resources, resources))
    _same_families(collector.describe(), collector.collect())


def test_the_pool_collector_describes_what_it_collects() -> None:
    core = PoolCore(PoolConfig([ModelSpec("a", 1 << 20)]), FixedProbe((1 << 30,)))
    pool = SimpleNamespace(core=core, host=SimpleNamespace(now=lambda: 0.0))
    collector = PoolCollector(cast(Pool, pool))
    _same_families(collector.describe(), collector.collect())
