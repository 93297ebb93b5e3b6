"""The request log live: a gateway that logs (``CONDUIT_GATEWAY_LOG=true``) against the
session's stack, its entries read through the api's seed paths (each filter, paging, own entries
only, an admin's view of all); and a gateway whose log database is stopped still answers every
call, its entries dropped and counted, and logs again once the database is back. An
unauthenticated call is logged without its payload; a call whose fields the database could not
hold (a session id of 100,000 characters) does not cost the entries written with it."""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks.request_log import LogEntry, find
from conduit import admin as conduit_admin
from conduit.runtime import migrate
from core.ids import new_request_id
from core.ports import free_port
from gateway.call_log import LoggedCall, log_entry
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.request_log import RequestLogWriter
from gateway.server import Gateway, start, token_auth
from gateway.settings import GatewaySettings
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.curl import run_curl
from tests.fixtures.gateway_stack import Live
from tests.fixtures.processes import Launcher
from tests.fixtures.servers import PostgresServer, create_database
from tests.fixtures.waiting import until, wait_for
from tests.gateway.conftest import EchoExecutor
from tracker.db import make_engine

METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def logging_gateway(live: Live, launcher: Launcher) -> Iterator[str]:
    proc, address = launcher.gateway(
        {
            "CONDUIT_GATEWAY_LOG": "true",
            "CONDUIT_GATEWAY_LOG_FLUSH_INTERVAL": "0.05",
            "CONDUIT_GATEWAY_METRICS_PORT": str(METRICS_PORT),
        }
    )
    yield address
    proc.stop()


@pytest.fixture(scope="module")
def paired_gateway(live: Live, launcher: Launcher) -> Iterator[str]:
    """A logging gateway that writes entries two at a time (a lone one after 5 s): the two
    calls a test makes in a row share one ``COPY``."""
    proc, address = launcher.gateway(
        {
            "CONDUIT_GATEWAY_LOG": "true",
            "CONDUIT_GATEWAY_LOG_BATCH": "2",
            "CONDUIT_GATEWAY_LOG_FLUSH_INTERVAL": "5",
        }
    )
    yield address
    proc.stop()


@pytest.fixture(scope="module")
def root(admin: Admin) -> str:
    """An admin's token: it reads every account's entries, and those of no account."""
    return admin._run(
        lambda engine: conduit_admin.create_account(
            engine, f"log-root-{uuid.uuid4().hex[:6]}", True
        )
    )


def infer(address: str, token: str, **fields: Any) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            BlockInferenceServiceStub(channel).infer(
                BlockInferencePacket(**fields),
                metadata=[("authorization", f"Bearer {token}")],
                timeout=60,
            )
        except grpc.RpcError as error:
            return error.code()  # type: ignore[attr-defined, no-any-return]
    return grpc.StatusCode.OK


def logs(stack: Stack, token: str, path: str, **params: Any) -> Any:
    answer = httpx.get(
        f"{stack.api_url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_calls_are_logged_and_read_by_the_seeds_paths(
    logging_gateway: str, live: Live, stack: Stack, token: str, admin: Admin
) -> None:
    session = f"sess-{uuid.uuid4().hex[:8]}"
    for seq_no in (1, 2, 3):
        data = json.dumps({"prompt": f"p{seq_no}"})
        code = infer(
            logging_gateway,
            token,
            block_id=live.block,
            session_id=session,
            seq_no=seq_no,
            data=data,
            frame_ptr=b"frame-1",
        )
        assert code == grpc.StatusCode.OK
    missing = "blk-nosuch00"
    assert infer(logging_gateway, token, block_id=missing, session_id=session, seq_no=4) == (
        grpc.StatusCode.NOT_FOUND
    )
    found = wait_for(
        lambda: (
            len(rows := logs(stack, token, f"/logs/session/{session}")["results"]) == 4 and rows
        ),
        "the session's four calls logged",
    )
    assert [r["seq_no"] for r in found] == [1, 2, 3, 4]
    assert [r["status"] for r in found] == ["OK", "OK", "OK", "NOT_FOUND"]
    assert "no block" in found[3]["error"] and found[0]["error"] is None
    assert json.loads(found[0]["data"]) == {"prompt": "p1"}
    assert found[0]["frame_ptr"] == "frame-1" and found[0]["latency_ms"] > 0
    assert uuid.UUID(found[0]["request_id"]).version == 7

    one = logs(stack, token, f"/logs/request/{found[2]['request_id']}")["results"]
    assert [r["seq_no"] for r in one] == [3]
    on_block = logs(stack, token, f"/logs/block/{missing}")["results"]
    assert [r["request_id"] for r in on_block] == [found[3]["request_id"]]
    both = logs(stack, token, "/logs/session_block", session_id=session, block_id=live.block)
    assert [r["seq_no"] for r in both["results"]] == [1, 2, 3]

    first = logs(stack, token, f"/logs/session/{session}", limit=3)
    assert [r["seq_no"] for r in first["results"]] == [1, 2, 3] and first["next"]
    rest = logs(stack, token, f"/logs/session/{session}", limit=3, cursor=first["next"])
    assert [r["seq_no"] for r in rest["results"]] == [4] and rest["next"] is None
    later = logs(stack, token, f"/logs/session/{session}", since=found[3]["ts"])
    assert [r["seq_no"] for r in later["results"]] == [4]

    stranger = admin.create_account(f"log-other-{uuid.uuid4().hex[:6]}")
    assert logs(stack, stranger, f"/logs/session/{session}")["results"] == []
    root = admin._run(
        lambda engine: conduit_admin.create_account(
            engine, f"log-admin-{uuid.uuid4().hex[:6]}", True
        )
    )
    assert len(logs(stack, root, f"/logs/session/{session}")["results"]) == 4
    refused = httpx.get(
        f"{stack.api_url}/logs/session/{session}",
        params={"cursor": "nonsense"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert refused.status_code == 400
    assert httpx.get(f"{stack.api_url}/logs/session/{session}").status_code == 401


def test_a_huge_session_id_does_not_cost_another_accounts_entry(
    paired_gateway: str, live: Live, stack: Stack, token: str, admin: Admin
) -> None:
    """One call with a session id of 100,000 characters (refused: longer than 256) and another
    account's call, written in the same ``COPY``: both are logged, the long id cut to 256
    characters, its end marked."""
    huge_block, other_block = (f"blk-{uuid.uuid4().hex[:8]}" for _ in range(2))
    huge = secrets.token_hex(50_000)  # random: Postgres cannot compress it into its index
    code = infer(paired_gateway, token, block_id=huge_block, session_id=huge, seq_no=1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    other = admin.create_account(f"log-other-{uuid.uuid4().hex[:6]}")
    assert infer(paired_gateway, other, block_id=other_block, seq_no=1) == (
        grpc.StatusCode.NOT_FOUND
    )
    theirs = wait_for(
        lambda: logs(stack, other, f"/logs/block/{other_block}")["results"],
        "the other account's entry logged",
    )
    assert [r["status"] for r in theirs] == ["NOT_FOUND"]
    (mine,) = logs(stack, token, f"/logs/block/{huge_block}")["results"]
    assert mine["status"] == "INVALID_ARGUMENT"
    assert mine["session_id"] == huge[:255] + "…"
    assert len(mine["error"]) <= 1024


def test_an_unauthenticated_call_is_logged_without_its_payload(
    paired_gateway: str, live: Live, stack: Stack, token: str, root: str
) -> None:
    """A call with no valid token carrying 4 MiB (``frame_ptr``, ``query_parameters``,
    ``output_ptr``, ``data``) keeps none of it in the log; an account's call made after it
    shows when it has been written."""
    session, marker = (f"sess-{uuid.uuid4().hex[:8]}" for _ in range(2))
    code = infer(
        paired_gateway,
        "not-a-token",
        block_id=live.block,
        session_id=session,
        frame_ptr=b"f" * (3 * 1024 * 1024),
        query_parameters=json.dumps({"q": "q" * 512 * 1024}),
        output_ptr=json.dumps({"graph": {"x": "o" * 256 * 1024}}),
        data=json.dumps({"prompt": "d" * 1024}),
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert infer(paired_gateway, token, block_id=live.block, session_id=marker) == (
        grpc.StatusCode.OK
    )
    wait_for(
        lambda: logs(stack, token, f"/logs/session/{marker}")["results"],
        "the call made after it logged",
        timeout=60,
    )
    # Entries are written in the order the calls ended: the stranger's is written by now.
    for row in logs(stack, root, f"/logs/session/{session}")["results"]:
        assert row["account_id"] is None and row["status"] == "UNAUTHENTICATED"
        payload = [row[f] for f in ("frame_ptr", "query_parameters", "output_ptr", "data")]
        assert not any(payload), [len(p or "") for p in payload]


def test_an_entry_without_an_account_keeps_no_payload() -> None:
    """What the log keeps of a call no token named (should one reach the handler: the gateway
    refuses them before reading their message) is what names it, never what it carried; an
    account's payload is kept up to ``log_max_data_bytes`` per field."""
    packet = BlockInferencePacket(
        block_id="blk-abcdefgh",
        session_id="s" * 1000,
        frame_ptr=b"f" * (4 * 1024 * 1024),
        query_parameters="{}",
        output_ptr="{}",
        data="{}",
    )
    status = (grpc.StatusCode.UNAUTHENTICATED, "e" * 5000)
    stranger = log_entry(LoggedCall(new_request_id(), 0.0, 0.0), packet, (), status, 1 << 20)
    assert (stranger.frame_ptr, stranger.data, stranger.query_parameters) == (b"", b"", b"")
    assert stranger.output_ptr == b"" and stranger.account_id is None
    assert len(stranger.session_id) == 256 and stranger.error == "e" * 1023 + "…"
    known = LoggedCall(new_request_id(), 0.0, 0.0, account_id=7)
    mine = log_entry(known, packet, (), status, 1 << 20)
    assert mine.frame_ptr == b"" and (mine.data, mine.output_ptr) == (b"{}", b"{}")


def test_the_gateway_serves_its_metrics(logging_gateway: str, live: Live, token: str) -> None:
    """Calls by status, their latency, and the log's rows, on ``/metrics``."""
    assert infer(logging_gateway, token, block_id=live.block) == grpc.StatusCode.OK
    assert infer(logging_gateway, token, block_id="blk-nosuch00") == grpc.StatusCode.NOT_FOUND
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"

    def rows_written() -> bool:
        found = re.search(r"^conduit_gateway_log_rows_total (\S+)$", httpx.get(url).text, re.M)
        return found is not None and float(found[1]) >= 2

    wait_for(rows_written, "the log's rows counted")
    body = httpx.get(url).text
    assert re.search(r'^conduit_gateway_calls_total\{status="OK"\} [1-9]', body, re.M)
    assert re.search(r'^conduit_gateway_calls_total\{status="NOT_FOUND"\} [1-9]', body, re.M)
    assert "conduit_gateway_call_seconds_bucket" in body


@pytest.fixture
def log_server() -> Iterator[PostgresServer]:
    with tempfile.TemporaryDirectory(prefix="conduit-log-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        root.chmod(0o711)  # a root-started postgres runs as user postgres and must enter it
        server = PostgresServer(root / "postgres")
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
async def gateway_with_log(
    engine: AsyncEngine, log_server: PostgresServer
) -> AsyncIterator[tuple[Gateway, RequestLogWriter, AsyncEngine]]:
    url = create_database(log_server.url, "log")
    migrate(url)
    log_engine = make_engine(url, pool_size=2)
    writer = RequestLogWriter(log_engine, flush_interval=0.05)
    await writer.start()
    settings = GatewaySettings(default_deadline=5.0)
    served = await start(
        settings, EchoExecutor(), token_auth(engine, settings), free_port(), request_log=writer
    )
    yield served, writer, log_engine
    await served.stop(None)
    await writer.close(timeout=1)
    await log_engine.dispose()


async def test_inference_answers_with_the_log_database_stopped(
    gateway_with_log: tuple[Gateway, RequestLogWriter, AsyncEngine],
    log_server: PostgresServer,
    token: str,
) -> None:
    served, writer, log_engine = gateway_with_log

    async def call(session: str, n: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = BlockInferenceServiceStub(channel)
            for seq_no in range(1, n + 1):
                packet = BlockInferencePacket(
                    block_id="blk-abcdefgh", session_id=session, seq_no=seq_no
                )
                await stub.infer(
                    packet, metadata=[("authorization", f"Bearer {token}")], timeout=10
                )

    await call("before", 3)
    await until(lambda: _logged(log_engine, "before", 3), "the first calls logged")
    log_server.stop()
    await call("during", 20)  # every one answers: none waits on the log

    def failed() -> float:
        return (
            writer.registry.get_sample_value(
                "conduit_gateway_log_dropped_total", {"reason": "write_failed"}
            )
            or 0.0
        )

    await until(lambda: _true(failed() == 20), "the entries of the outage dropped and counted")
    log_server.start()
    await call("after", 3)
    await until(lambda: _logged(log_engine, "after", 3), "logging again once the database is back")
    assert await find(log_engine, account_id=None, session_id="during") == []


async def test_a_refused_entry_costs_only_itself(engine: AsyncEngine) -> None:
    """A batch holding entries Postgres cannot take (a session id too long for its index, a NUL
    in a text column) is written again in halves: its other entries are kept, the refused ones
    dropped and counted (``refused``)."""
    writer = RequestLogWriter(engine, batch=6, flush_interval=5)
    await writer.start()
    session = f"s-{uuid.uuid4().hex[:8]}"
    try:
        for seq_no in range(1, 7):
            fields: dict[str, Any] = {}
            if seq_no == 2:
                fields["session_id"] = secrets.token_hex(50_000)
            if seq_no == 4:
                fields["block_id"] = "blk-\x00"
            writer.record(_entry(session, seq_no, **fields))  # six at once: one batch
        await until(lambda: _logged(engine, session, 4), "the four good entries written")
        rows = await find(engine, account_id=None, session_id=session)
        assert [row["seq_no"] for row in rows] == [1, 3, 5, 6]
        refused = writer.registry.get_sample_value(
            "conduit_gateway_log_dropped_total", {"reason": "refused"}
        )
        assert refused == 2
    finally:
        await writer.close(timeout=1)


def _entry(session: str, seq_no: int, **fields: Any) -> LogEntry:
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "request_id": new_request_id(int(now.timestamp() * 1000)),
        "session_id": session,
        "block_id": "blk-aaaa",
        "seq_no": seq_no,
        "ts": now,
        "frame_ptr": b"",
        "data": b"{}",
        "query_parameters": b"",
        "output_ptr": b"",
        "status": "OK",
        "error": None,
        "latency_ms": 1.0,
        "account_id": None,
        **fields,
    }
    return LogEntry(**values)


async def _true(value: bool) -> bool:
    return value


async def _logged(engine: AsyncEngine, session: str, n: int) -> bool:
    try:
        return len(await find(engine, account_id=None, session_id=session)) == n
    except Exception:
        return False


# The seed's examples, verbatim.
SEED_LOG_EXAMPLES = (
    'curl -X GET "<server-url>/logs/session/<session_id>"',
    'curl -X GET "<server-url>/logs/request/<request_id>"',
    'curl -X GET "<server-url>/logs/block/<block_id>"',
    'curl -X GET "<server-url>/logs/session_block?session_id=<session_id>&block_id=<block_id>"',
)


def test_the_seeds_log_examples(logging_gateway: str, live: Live, stack: Stack, token: str) -> None:
    """Each of the seed's log requests, as the seed writes it (through ``curl`` when it is
    installed, a bearer token added), answers the entries it names."""
    session = f"sess-{uuid.uuid4().hex[:8]}"
    for seq_no in (1, 2):
        code = infer(logging_gateway, token, block_id=live.block, session_id=session, seq_no=seq_no)
        assert code == grpc.StatusCode.OK
    rows = wait_for(
        lambda: (
            len(found := logs(stack, token, f"/logs/session/{session}")["results"]) == 2 and found
        ),
        "the session's calls logged",
    )
    values = {
        "<server-url>": stack.api_url,
        "<session_id>": session,
        "<request_id>": rows[1]["request_id"],
        "<block_id>": live.block,
    }
    expected = [[1, 2], [2], None, [1, 2]]
    for example, seq_nos in zip(SEED_LOG_EXAMPLES, expected, strict=True):
        command = example
        for placeholder, value in values.items():
            command = command.replace(placeholder, value)
        status, answer = run_curl(command, token)
        assert status == 200, answer
        mine = [r["seq_no"] for r in answer["results"] if r["session_id"] == session]
        if seq_nos is None:  # the block's log: this session's among the block's other calls
            assert mine == [1, 2]
        else:
            assert mine == seq_nos
            assert all(r["session_id"] == session for r in answer["results"])
