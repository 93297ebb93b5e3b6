"""The runner API spec's capability and health documents of a pool, and of each of its slots
as if it were a single runner: read from the core's slot views at each call, never cached."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from protocol.documents import (
    CapabilitiesDocument,
    Features,
    LoadedModel,
    LoadingModel,
    ModelInventory,
    QueueBounds,
    QueueState,
)
from protocol.lifecycle import HealthDocument, ModelStatus
from protocol.values import RunnerHealth
from runners import COG_VERSION
from runners.pool.slots import SlotState, SlotView
from runners.pool.state import Pool


def capabilities(pool: Pool, only: str | None = None) -> dict[str, Any]:
    """The pool's capability document (a ``slots`` list beside the spec's inventory); with
    ``only``, one slot's, under a runner id and type of its own."""
    views = [v for v in pool.core.slots() if only is None or v.model == only]
    loaded = [
        LoadedModel(
            id=v.model,
            memoryBytes=v.observed_bytes,
            device=pool.host.backends[v.model].device,
        )
        for v in views
        if v.state is SlotState.READY
    ]
    loading = [LoadingModel(id=v.model) for v in views if v.state is SlotState.LOADING]
    concurrency = {m.name: m.concurrency for m in pool.file.models}
    on_gpu = any(pool.host.backends[v.model].device == "cuda" for v in views)
    document = CapabilitiesDocument(
        runner_type="conduit-pool" if only is None else f"conduit-pool-{only}",
        runner_id=pool.runner_id if only is None else f"{pool.runner_id}/{only}",
        models=ModelInventory(loaded=loaded, loading=loading, available=[v.model for v in views]),
        queue=QueueState(
            depth=pool.core.queued(),
            max_depth=pool.file.max_queue_depth,
            slots=sum(concurrency[v.model] for v in views),
            slotsInUse=sum(v.in_flight for v in views),
        ),
        capabilities=Features(
            streaming=True, multi_tenant=True, modelLoad=True, cancel=True, modelPool=True
        ),
        health=RunnerHealth.HEALTHY,
        hardware="gpu" if on_gpu else "cpu",
        cogVersion=COG_VERSION,
        startedAt=pool.started_at,
        generatedAt=datetime.now(UTC).isoformat(),
        slots=[_slot(pool, v) for v in views],
        budgets={str(d): b for d, b in pool.core.budgets().items()},
        used={str(d): pool.core.used(d) for d in pool.core.budgets()},
    )
    return document.wire()


def _slot(pool: Pool, view: SlotView) -> dict[str, Any]:
    backend, now = pool.host.backends[view.model], pool.host.now()
    wall = time.time() - now  # the loop clock's instants as epoch seconds

    def epoch(at: float | None) -> float | None:
        return None if at is None or at == 0.0 else round(wall + at, 3)

    return {
        "model": view.model,
        "state": view.state.value,
        "pinned": view.pinned,
        "device": backend.device,
        "devices": list(view.devices),
        "leaseBytes": view.lease_bytes,
        "observedBytes": view.observed_bytes,
        "inFlight": view.in_flight,
        "lastUsed": epoch(view.last_used),
        "expiresAt": epoch(view.expires_at),
        "loadEwmaSeconds": round(view.load_ewma, 6),
        "lastTransition": {
            "state": view.last_state.value,
            "reason": view.last_reason,
            "at": epoch(view.last_at),
        },
        "cooldownUntil": epoch(view.cooldown_until),
        "lastUnload": None
        if (unload := pool.host.last_unload.get(view.model)) is None
        else {"reason": unload[0], "at": epoch(unload[1])},
        "url": f"/models/{view.model}",
    }


def health(pool: Pool) -> HealthDocument:
    """The whole pool's: unhealthy only while it stops."""
    reasons = ["stopping"] if pool.host.closing else []
    views = pool.core.slots()
    ready = sum(1 for v in views if v.state is SlotState.READY)
    return HealthDocument(
        status=RunnerHealth.UNHEALTHY if reasons else RunnerHealth.HEALTHY,
        uptime=math.floor(time.monotonic() - pool.began),
        models_loaded=ready,
        queue_depth=pool.core.queued(),
        reasons=reasons,
        model=ModelStatus(id="pool", state=f"{ready}/{len(views)} ready"),
        queue=QueueBounds(depth=pool.core.queued(), max_depth=pool.file.max_queue_depth),
    )


def slot_health(pool: Pool, name: str) -> HealthDocument:
    """One slot's, as a single runner answers it, so a director pointed at the slot is ready
    when the slot can serve: an idle slot loads on demand and is healthy; one whose load
    failed (in its cooldown), a saturated queue or a pool that stops is not."""
    view = pool.view(name)
    reasons = ["stopping"] if pool.host.closing else []
    if view.state is SlotState.FAILED:
        reasons.append(f"model {view.state.value}")
    depth, max_depth = pool.core.queued(), pool.file.max_queue_depth
    if max_depth and depth >= max_depth:
        reasons.append("queue saturated")
    return HealthDocument(
        status=RunnerHealth.UNHEALTHY if reasons else RunnerHealth.HEALTHY,
        uptime=math.floor(time.monotonic() - pool.began),
        models_loaded=1 if view.state is SlotState.READY else 0,
        queue_depth=depth,
        reasons=reasons,
        model=ModelStatus(id=name, state=view.state.value),
        queue=QueueBounds(depth=depth, max_depth=max_depth),
    )
