"""The inference gateway (``conduit gateway``) against the paths it rides, on a throwaway local
stack.

``.venv/bin/python -m bench.gateway`` from the repo root. Stack: a stock ``conduit runner echo``
behind ``bench/echo`` and a runner of the ``inspect`` fixture model
(:mod:`tests.fixtures.inspect_model`, whose output is an object, as a graph's child needs)
behind ``bench/inspect``, 4 slots each, a director for each, one api and one gateway that joins
the synchronous lane (``CONDUIT_GATEWAY_LANE=true``). The client is this process: one gRPC
channel and one ``httpx.AsyncClient`` with keep-alive, on uvloop.

1. One block, sequential calls in pairs interleaved round by round (the pair's order swapped
   every round, so the work one call leaves behind falls on both paths alike): a durable block
   of ``bench/echo`` (``synchronous`` false) through ``infer`` against the same input through
   ``POST /v1/deployments/bench/echo/predictions`` with ``Prefer: wait``; then a synchronous
   block of ``bench/echo`` through ``infer`` against ``POST /v1/deployments/bench/echo/run``.
   p50/p99 and the differences (goal: the gateway within +1 ms of the path it rides). The
   clients differ (gRPC's C core, httpx in Python), so the two transports' floors come first:
   the gateway's gRPC health ``Check`` against the api's ``GET /livez``, interleaved likewise.
2. Graphs (``output_ptr``) of ``bench/inspect`` blocks: a chain of 3, and a fan-out of 3 (a head
   and three leaves), each against its slowest path run as single ``infer`` calls in sequence,
   each step given what the graph gives it (the chain: 3 calls; the fan-out: the head and one
   leaf); graph and path interleaved round by round. Time over the slowest path.
3. Session replay: N tasks with distinct ``(session_id, seq_no)`` on the durable echo block,
   sequentially, then the same N again. The replays' p50/p99 against the first pass's, each
   replay compared byte for byte with its first answer, and the account's predictions counted
   in Postgres after each pass: the replays must add none.

Each repeat runs 1–3 again (3 with a fresh account); figures are median (min–max) over the
repeats. See bench/README.md for the results measured so far.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub

from bench.report import Repeated, machine, quantile, ratio, table
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async
from gateway.proto.inference_pb2 import AIOSPacket, BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.inspect_model import GRAPH_BLOCKS, REGISTRATION

ECHO = "bench/echo"
INSPECT = "bench/inspect"
SLOTS = 4
ECHO_INPUT: dict[str, Any] = {"prompt": "bench", "n": 1, "delay": 0}
HEAD_INPUT: dict[str, Any] = {"prompt": "bench"}
#: The chain's blocks in order; the fan-out's head and its leaves (the same blocks).
CHAIN = GRAPH_BLOCKS[:3]
FAN_HEAD, FAN_LEAVES = GRAPH_BLOCKS[0], GRAPH_BLOCKS[1:4]
CHAIN_GRAPH = {"graph": {a: [b] for a, b in zip(CHAIN, CHAIN[1:], strict=False)} | {CHAIN[-1]: []}}
FAN_GRAPH = {"graph": {FAN_HEAD: list(FAN_LEAVES)} | {leaf: [] for leaf in FAN_LEAVES}}
TARGET_MS = 1.0
#: Each call's deadline (gRPC) or timeout (HTTP), in seconds.
CALL_TIMEOUT = 30.0
#: How long the stack may take before every path answers (runners advertised, lanes joined).
READY_TIMEOUT = 60.0
#: Refusals that mean "not ready yet" while the stack settles.
NOT_YET_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
NOT_YET_STATUSES = (429, 503)


@dataclass(frozen=True)
class Options:
    requests: int
    warmup: int
    repeats: int
    graphs: int
    sessions: int


def ms(seconds: float) -> float:
    return seconds * 1000


class NotYet(Exception):
    """An HTTP path refused with a status that settles by itself (429, 503)."""


class Paths:
    """The calls measured, each timed on this process's clock and checked."""

    def __init__(
        self, http: httpx.AsyncClient, channel: grpc.aio.Channel, api_url: str, token: str
    ) -> None:
        self.http = http
        self.stub = BlockInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.wait_url = f"{api_url}/v1/deployments/{ECHO}/predictions"
        self.run_url = f"{api_url}/v1/deployments/{ECHO}/run"
        self.livez_url = f"{api_url}/livez"
        self.health_stub = HealthStub(channel)

    async def infer(
        self,
        block_id: str,
        data: dict[str, Any],
        graph: dict[str, Any] | None = None,
        session_id: str = "",
        seq_no: int = 0,
    ) -> tuple[float, AIOSPacket]:
        packet = BlockInferencePacket(
            block_id=block_id,
            data=json.dumps(data),
            output_ptr=json.dumps(graph) if graph is not None else "",
            session_id=session_id,
            seq_no=seq_no,
        )
        start = time.perf_counter()
        answer: AIOSPacket = await self.stub.infer(
            packet, metadata=self.metadata, timeout=CALL_TIMEOUT
        )
        return ms(time.perf_counter() - start), answer

    async def infer_ms(self, block_id: str, data: dict[str, Any]) -> float:
        return (await self.infer(block_id, data))[0]

    async def health(self) -> float:
        """The gateway's gRPC health ``Check``: what a unary call costs on this channel."""
        start = time.perf_counter()
        answer = await self.health_stub.Check(HealthCheckRequest(), timeout=CALL_TIMEOUT)
        elapsed = ms(time.perf_counter() - start)
        if answer.status != HealthCheckResponse.SERVING:
            raise RuntimeError(f"the gateway's health answered {answer}")
        return elapsed

    async def livez(self) -> float:
        """The api's ``GET /livez``: what a request costs on this HTTP client."""
        start = time.perf_counter()
        response = await self.http.get(self.livez_url)
        elapsed = ms(time.perf_counter() - start)
        if response.status_code != 200:
            raise RuntimeError(f"{self.livez_url} answered {response.status_code}")
        return elapsed

    async def wait(self, input: dict[str, Any]) -> float:
        """``Prefer: wait`` on ``bench/echo``: 201 and ``succeeded``."""
        headers = {**self.headers, "Prefer": "wait"}
        return await self._post(self.wait_url, input, headers, 201)

    async def run(self, input: dict[str, Any]) -> float:
        """``/run`` on ``bench/echo``: 200 and ``succeeded``."""
        return await self._post(self.run_url, input, self.headers, 200)

    async def _post(
        self, url: str, input: dict[str, Any], headers: dict[str, str], ok: int
    ) -> float:
        start = time.perf_counter()
        response = await self.http.post(url, json={"input": input}, headers=headers)
        elapsed = ms(time.perf_counter() - start)
        if response.status_code in NOT_YET_STATUSES:
            raise NotYet(f"{url} answered {response.status_code}: {response.text}")
        if response.status_code != ok or response.json()["status"] != "succeeded":
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text}")
        return elapsed


def output(answer: AIOSPacket) -> Any:
    return json.loads(answer.data)


async def until_ready(paths: Paths, durable: str, synchronous: str) -> None:
    """Every path answers once: the directors have advertised their runners to the api and the
    gateway, and both hold permits of the echo runner in the lane."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            await paths.infer(durable, ECHO_INPUT)
            await paths.infer(synchronous, ECHO_INPUT)
            await paths.wait(ECHO_INPUT)
            await paths.run(ECHO_INPUT)
            await paths.infer(FAN_HEAD, HEAD_INPUT, FAN_GRAPH)
            return
        except grpc.aio.AioRpcError as error:
            if error.code() not in NOT_YET_CODES or time.monotonic() > deadline:
                raise
        except NotYet:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


# 1. One block


Call = Callable[[], Awaitable[float]]


async def interleaved(
    pair: Sequence[tuple[str, Call]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """``warmup + rounds`` rounds of each call of ``pair``, the order swapped every round;
    the timings of the last ``rounds``."""
    samples: dict[str, list[float]] = {name: [] for name, _ in pair}
    for i in range(warmup + rounds):
        for name, call in pair if i % 2 == 0 else pair[::-1]:
            elapsed = await call()
            if i >= warmup:
                samples[name].append(elapsed)
    return samples


GW_DURABLE = "gateway infer, durable block"
WAIT = "POST .../predictions, Prefer: wait"
GW_SYNC = "gateway infer, synchronous block"
RUN = "POST .../run"
HEALTH = "floor: gateway's gRPC health Check"
LIVEZ = "floor: api's GET /livez"


async def one_block(
    paths: Paths, durable: str, synchronous: str, options: Options
) -> dict[str, list[float]]:
    durable_pair: list[tuple[str, Call]] = [
        (GW_DURABLE, lambda: paths.infer_ms(durable, ECHO_INPUT)),
        (WAIT, lambda: paths.wait(ECHO_INPUT)),
    ]
    sync_pair: list[tuple[str, Call]] = [
        (GW_SYNC, lambda: paths.infer_ms(synchronous, ECHO_INPUT)),
        (RUN, lambda: paths.run(ECHO_INPUT)),
    ]
    floor_pair: list[tuple[str, Call]] = [(HEALTH, paths.health), (LIVEZ, paths.livez)]
    samples = await interleaved(floor_pair, options.requests, options.warmup)
    samples.update(await interleaved(durable_pair, options.requests, options.warmup))
    samples.update(await interleaved(sync_pair, options.requests, options.warmup))
    return samples


# 2. Graphs


async def slowest_path(paths: Paths, blocks: Sequence[str]) -> tuple[float, Any]:
    """``blocks`` as single ``infer`` calls in sequence, each given its predecessor's output
    (the first: the head's input); the total time and the last output."""
    start = time.perf_counter()
    data = HEAD_INPUT
    for block in blocks:
        data = output((await paths.infer(block, data))[1])
    return ms(time.perf_counter() - start), data


CHAIN_NAME = "chain of 3"
FAN_NAME = "fan-out of 3"


@dataclass
class GraphSamples:
    graph: list[float] = field(default_factory=list)
    path: list[float] = field(default_factory=list)


def _chain_leaf(answer: Any) -> Any:
    """A graph with one leaf answers that leaf's output."""
    return answer


def _fan_leaf(answer: Any) -> Any:
    """A graph with several leaves answers their outputs by block id."""
    return answer[FAN_LEAVES[0]]


async def graphs(paths: Paths, options: Options) -> dict[str, GraphSamples]:
    """Each graph and its slowest path, interleaved; the first round checks that the graph
    answers what its path does."""
    cases: tuple[tuple[str, dict[str, Any], tuple[str, ...], Callable[[Any], Any]], ...] = (
        (CHAIN_NAME, CHAIN_GRAPH, CHAIN, _chain_leaf),
        (FAN_NAME, FAN_GRAPH, (FAN_HEAD, FAN_LEAVES[0]), _fan_leaf),
    )
    samples = {name: GraphSamples() for name, *_ in cases}
    for i in range(options.warmup + options.graphs):
        for name, graph, path, leaf in cases:
            if i % 2 == 0:
                graph_ms, answer = await paths.infer(path[0], HEAD_INPUT, graph)
                path_ms, last = await slowest_path(paths, path)
            else:
                path_ms, last = await slowest_path(paths, path)
                graph_ms, answer = await paths.infer(path[0], HEAD_INPUT, graph)
            if i == 0 and leaf(output(answer)) != last:
                raise RuntimeError(f"{name} answered {answer.data}; its path answered {last}")
            if i >= options.warmup:
                samples[name].graph.append(graph_ms)
                samples[name].path.append(path_ms)
    return samples


# 3. Session replay


@dataclass
class Replay:
    first: list[float]
    again: list[float]
    #: The account's predictions after the first pass, and after the replays.
    made_first: int
    made_after: int
    #: Replays whose answer was the first answer, byte for byte.
    identical: int


async def replay(stack: BenchStack, paths: Paths, account: str, block: str, count: int) -> Replay:
    tag = uuid.uuid4().hex[:8]
    pairs = [(f"bench-{tag}-{i}", i + 1) for i in range(count)]
    first, again, answers = [], [], []
    for session_id, seq_no in pairs:
        elapsed, answer = await paths.infer(block, ECHO_INPUT, None, session_id, seq_no)
        first.append(elapsed)
        answers.append(answer.SerializeToString())
    made_first = await asyncio.to_thread(predictions_of, stack, account)
    identical = 0
    for (session_id, seq_no), stored in zip(pairs, answers, strict=True):
        elapsed, answer = await paths.infer(block, ECHO_INPUT, None, session_id, seq_no)
        again.append(elapsed)
        identical += answer.SerializeToString() == stored
    made_after = await asyncio.to_thread(predictions_of, stack, account)
    return Replay(first, again, made_first, made_after, identical)


def predictions_of(stack: BenchStack, account: str) -> int:
    [(count,)] = stack.query(
        "SELECT count(*) FROM predictions p JOIN accounts a ON a.id = p.account_id "
        "WHERE a.name = %s",
        (account,),
    )
    return int(count)


# Running it all


@dataclass(frozen=True)
class Setup:
    api_url: str
    address: str
    token: str
    durable: str
    synchronous: str
    #: One fresh account (name, token) per repeat, for the replays.
    replay_accounts: list[tuple[str, str]]


def start(stack: BenchStack, options: Options) -> Setup:
    echo = stack.runner(SLOTS)
    stack.deploy(ECHO, echo, SLOTS)
    inspect = stack.runner(SLOTS, "inspect", {"CONDUIT_RUNNER_MODELS": REGISTRATION})
    stack.deploy(INSPECT, inspect, SLOTS)
    durable = stack.admin.create_block(ECHO)
    synchronous = stack.admin.create_block(ECHO, synchronous=True)
    for block_id in sorted({*CHAIN, FAN_HEAD, *FAN_LEAVES}):
        stack.admin.create_block(INSPECT, block_id=block_id)
    api_url = stack.api()
    address = stack.gateway({"CONDUIT_GATEWAY_LANE": "true"})
    accounts = []
    for _ in range(options.repeats):
        name = f"bench-replay-{uuid.uuid4().hex[:8]}"
        accounts.append((name, stack.admin.create_account(name)))
    return Setup(api_url, address, stack.token(), durable, synchronous, accounts)


@dataclass
class Row:
    """A path's p50 and p99 over the repeats."""

    p50: Repeated = field(default_factory=Repeated)
    p99: Repeated = field(default_factory=Repeated)

    def add(self, samples: Sequence[float]) -> None:
        self.p50.add(quantile(samples, 0.5))
        self.p99.add(quantile(samples, 0.99))


@dataclass
class Results:
    paths: dict[str, Row] = field(default_factory=dict)
    #: Per repeat: the gateway's p50 (p99) minus the path's it rides.
    gaps: dict[str, Row] = field(default_factory=dict)
    graphs: dict[str, dict[str, Row]] = field(default_factory=dict)
    #: Per graph, per repeat: graph p50 minus slowest path p50, and their ratio.
    over: dict[str, Repeated] = field(default_factory=dict)
    over_ratio: dict[str, Repeated] = field(default_factory=dict)
    replays: list[Replay] = field(default_factory=list)
    replay_rows: dict[str, Row] = field(default_factory=dict)

    def row(self, table: dict[str, Row], name: str) -> Row:
        return table.setdefault(name, Row())


def add_gap(results: Results, name: str, gateway: Sequence[float], path: Sequence[float]) -> None:
    row = results.row(results.gaps, name)
    row.p50.add(quantile(gateway, 0.5) - quantile(path, 0.5))
    row.p99.add(quantile(gateway, 0.99) - quantile(path, 0.99))


async def measure(stack: BenchStack, setup: Setup, options: Options) -> Results:
    results = Results()
    limits = httpx.Limits(max_keepalive_connections=4)
    async with (
        httpx.AsyncClient(timeout=CALL_TIMEOUT, limits=limits) as http,
        grpc.aio.insecure_channel(setup.address) as channel,
    ):
        paths = Paths(http, channel, setup.api_url, setup.token)
        await until_ready(paths, setup.durable, setup.synchronous)
        for repeat, (account, token) in enumerate(setup.replay_accounts):
            single = await one_block(paths, setup.durable, setup.synchronous, options)
            for name, samples in single.items():
                results.row(results.paths, name).add(samples)
            add_gap(results, f"{GW_DURABLE} - Prefer: wait", single[GW_DURABLE], single[WAIT])
            add_gap(results, f"{GW_SYNC} - /run", single[GW_SYNC], single[RUN])
            add_gap(results, "floor: gRPC - HTTP", single[HEALTH], single[LIVEZ])
            graphed = await graphs(paths, options)
            for name, timing in graphed.items():
                rows = results.graphs.setdefault(name, {})
                results.row(rows, "graph").add(timing.graph)
                results.row(rows, "slowest path").add(timing.path)
                graph_p50, path_p50 = quantile(timing.graph, 0.5), quantile(timing.path, 0.5)
                results.over.setdefault(name, Repeated()).add(graph_p50 - path_p50)
                results.over_ratio.setdefault(name, Repeated()).add(graph_p50 / path_p50)
            replayer = Paths(http, channel, setup.api_url, token)
            replayed = await replay(stack, replayer, account, setup.durable, options.sessions)
            results.replays.append(replayed)
            results.row(results.replay_rows, "first pass (each task runs)").add(replayed.first)
            results.row(results.replay_rows, "replay (the stored answer)").add(replayed.again)
            print(
                f"  repeat {repeat + 1}: durable infer p50 "
                f"{quantile(single[GW_DURABLE], 0.5):.2f} ms vs Prefer: wait "
                f"{quantile(single[WAIT], 0.5):.2f}; synchronous infer "
                f"{quantile(single[GW_SYNC], 0.5):.2f} vs /run {quantile(single[RUN], 0.5):.2f}; "
                f"replay p50 {quantile(replayed.again, 0.5):.2f} ms",
                flush=True,
            )
    return results


GRAPH_HEADERS = (
    "Graph",
    "p50",
    "p99",
    "slowest path p50",
    "slowest path p99",
    "p50 over path",
    "p50 ÷ path p50",
)


def report(results: Results, options: Options) -> str:
    def rows(named: dict[str, Row]) -> list[list[str]]:
        return [[name, row.p50.cell(2), row.p99.cell(2)] for name, row in named.items()]

    over_all = f"ms, median (min–max) over {options.repeats} repeats"
    one = table(["Path", "p50", "p99"], rows(results.paths) + rows(results.gaps))
    sync_gap = results.gaps[f"{GW_SYNC} - /run"].p50.median
    verdict = "met" if sync_gap <= TARGET_MS else "NOT met"
    graph_rows = []
    for name, named in results.graphs.items():
        graph, path = named["graph"], named["slowest path"]
        graph_rows.append(
            [
                name,
                graph.p50.cell(2),
                graph.p99.cell(2),
                path.p50.cell(2),
                path.p99.cell(2),
                results.over[name].cell(2),
                results.over_ratio[name].cell(2),
            ]
        )
    graph_table = table(GRAPH_HEADERS, graph_rows)
    first = results.replay_rows["first pass (each task runs)"].p50.median
    again = results.replay_rows["replay (the stored answer)"].p50.median
    counts = "; ".join(
        f"{r.made_first} after the first pass, {r.made_after} after the replays "
        f"(+{r.made_after - r.made_first}), {r.identical}/{len(r.again)} identical"
        for r in results.replays
    )
    return "\n".join(
        [
            f"1. One block, echo {ECHO_INPUT}: {options.requests} sequential calls per path "
            f"after {options.warmup} warm-up, pairs interleaved; {over_all}",
            one,
            f"synchronous block over /run at p50: {sync_gap:+.2f} ms (goal ≤ +{TARGET_MS:g} ms: "
            f"{verdict})",
            "",
            f"2. Graphs of inspect blocks, {options.graphs} each after {options.warmup} "
            f"warm-up, interleaved with their slowest path as single infer calls in sequence "
            f"(chain: 3 calls; fan-out: head + one leaf); {over_all}",
            graph_table,
            "",
            f"3. Session replay: {options.sessions} tasks with distinct (session_id, seq_no) on "
            f"the durable echo block, then the same again; {over_all}",
            table(["Pass", "p50", "p99"], rows(results.replay_rows)),
            f"replay p50 / first pass p50: {ratio(again, first)}",
            f"the account's predictions, per repeat: {counts}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="timed calls per path in 1")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first, in 1 and 2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--graphs", type=int, default=100, help="timed runs per graph in 2")
    parser.add_argument("--sessions", type=int, default=100, help="tasks replayed in 3")
    args = parser.parse_args()
    options = Options(args.requests, args.warmup, args.repeats, args.graphs, args.sessions)
    began = time.monotonic()
    with running_stack() as stack:
        setup = start(stack, options)
        results = run_async(measure(stack, setup, options))
    print(
        f"\nbench.gateway: gateway (CONDUIT_GATEWAY_LANE=true), api, echo and inspect runners "
        f"({SLOTS} slots) with their directors"
    )
    print(machine())
    print(report(results, options))
    print(f"\ntotal run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
