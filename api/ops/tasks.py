"""The operator page's background work (bulk actions), held by the app so that shutdown can
stop it between batches (``api.ops.stop``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from fastapi import FastAPI


def spawn(app: FastAPI, work: Coroutine[Any, Any, None]) -> None:
    tasks: set[asyncio.Task[None]] = app.state.ops_tasks
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
