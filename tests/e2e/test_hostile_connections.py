"""Connections that hold the api without asking it anything are bounded: real sockets against a
real api process whose limits are small, so that each case ends in seconds.

Silent sockets, heads that never end, bodies that stall or drip, answers never read, heads of
any size, connections past a client address's share or the server's: each is ended or refused
while a well-behaved client is still served. A request with a body is authenticated before its
body is read.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.memory import peak_rss, reset_peak_rss
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.waiting import pace, wait_for

HEAD_TIMEOUT = 3
MAX_HEAD_BYTES = 8192
MAX_HEADERS = 20
PER_ADDRESS = 20
MAX_CONNECTIONS = 60
LIMITS = {
    "CONDUIT_API_HEAD_TIMEOUT": str(HEAD_TIMEOUT),
    "CONDUIT_API_MAX_HEAD_BYTES": str(MAX_HEAD_BYTES),
    "CONDUIT_API_MAX_HEADERS": str(MAX_HEADERS),
    "CONDUIT_API_BODY_TIMEOUT": "1",
    "CONDUIT_API_BODY_MIN_RATE": "64",
    "CONDUIT_API_SEND_TIMEOUT": "2",
    "CONDUIT_API_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "CONDUIT_API_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
    "CONDUIT_API_MAX_PIPELINED": "4",
}
#: What a test allows the api to take before it must have acted (a bound for failing, never a
#: duration the test expects).
PATIENCE = 30.0
MIB = 1024 * 1024
TCP_ESTABLISHED = 1


@dataclass(frozen=True)
class Api:
    proc: Proc
    url: str
    host: str
    port: int

    @property
    def pid(self) -> int:
        assert self.proc.popen is not None
        return self.proc.popen.pid


@pytest.fixture(scope="module")
def api(launcher: Launcher, stack: Stack) -> Iterator[Api]:
    """An api of its own with small limits (``stack`` only makes the echo deployment exist),
    stopped after the module: a replica left running keeps a share of the lane's permits."""
    proc, url = launcher.api(env=LIMITS)
    port = int(url.rsplit(":", 1)[1])
    yield Api(proc, url, "127.0.0.1", port)
    proc.stop()


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def connect(api: Api, sockets: list[socket.socket], source: str = "127.0.0.1") -> socket.socket:
    address = (api.host, api.port)
    sock = socket.create_connection(address, timeout=PATIENCE, source_address=(source, 0))
    sockets.append(sock)
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the api sends until it closes the connection (a reset ends it too)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def status_of(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def problem_of(answer: bytes) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), head
    problem: dict[str, object] = orjson.loads(body)
    return problem


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the kernel has seen the api end this connection, without reading from it."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def healthy(api: Api, source: str = "127.0.0.1") -> bool:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=PATIENCE) as client:
        try:
            return client.get(f"{api.url}/health").status_code == 200
        except httpx.HTTPError:
            return False


def test_silent_connections_are_closed_after_the_head_timeout(
    api: Api, sockets: list[socket.socket]
) -> None:
    silent = [connect(api, sockets, "127.0.0.2") for _ in range(PER_ADDRESS)]
    for sock in silent:
        # Nothing asked, nothing answered: the api just closes.
        assert read_to_end(sock) == b""
    assert healthy(api, "127.0.0.2")


def test_an_unfinished_head_is_answered_408_and_closed(
    api: Api, sockets: list[socket.socket]
) -> None:
    sock = connect(api, sockets, "127.0.0.3")
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: conduit\r\nX-Never: ends")
    answer = read_to_end(sock)
    assert status_of(answer) == 408, answer
    assert problem_of(answer)["status"] == 408


def test_connections_past_an_address_share_are_refused_while_others_are_served(
    api: Api, sockets: list[socket.socket]
) -> None:
    for _ in range(PER_ADDRESS):
        connect(api, sockets, "127.0.0.4")
    refused = read_to_end(connect(api, sockets, "127.0.0.4"))
    assert status_of(refused) == 503, refused
    assert "Your address" in str(problem_of(refused)["detail"])
    assert healthy(api, "127.0.0.5")


def test_connections_past_the_server_cap_are_refused(
    api: Api, sockets: list[socket.socket]
) -> None:
    sources = [f"127.0.1.{n}" for n in range(1, MAX_CONNECTIONS // PER_ADDRESS + 1)]
    for source in sources:
        for _ in range(PER_ADDRESS):
            connect(api, sockets, source)
    refused = read_to_end(connect(api, sockets, "127.0.1.200"))
    assert status_of(refused) == 503, refused
    assert "The server holds" in str(problem_of(refused)["detail"])
    for sock in sockets:
        sock.close()
    wait_for(lambda: healthy(api, "127.0.1.201"), "the api serving again once they left")


def test_a_head_with_too_many_fields_gets_431(api: Api, sockets: list[socket.socket]) -> None:
    sock = connect(api, sockets, "127.0.0.6")
    fields = b"".join(b"X-Field-%d: x\r\n" % n for n in range(MAX_HEADERS + 10))
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: conduit\r\n" + fields + b"\r\n")
    answer = read_to_end(sock)
    assert status_of(answer) == 431, answer
    assert problem_of(answer)["status"] == 431


@pytest.mark.parametrize("shape", ["one endless field", "endless fields"])
def test_a_huge_head_is_refused_before_it_is_read_whole(
    api: Api, sockets: list[socket.socket], shape: str
) -> None:
    sock = connect(api, sockets, "127.0.0.7")
    reset_peak_rss(api.pid)
    before = peak_rss(api.pid)
    piece = b"a" * 65536 if shape == "one endless field" else b"X-A: b\r\n" * 8192
    sent = 0
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: conduit\r\nX-Big: ")
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while sent < 64 * MIB:
            sock.sendall(piece)
            sent += len(piece)
    answer = read_to_end(sock)
    assert sent < 64 * MIB, "the api read a 64 MiB head"
    assert status_of(answer) in (431, None), answer  # the refusal, or a reset that beat it
    assert peak_rss(api.pid) - before < 32 * MIB


def _authorised_upload(api: Api, token: str, headers: bytes) -> bytes:
    return (
        f"POST /v1/deployments/{ECHO}/predictions HTTP/1.1\r\nHost: conduit\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n".encode()
        + headers
        + b"\r\n"
    )


def test_a_stalled_body_is_ended(api: Api, admin: Admin, sockets: list[socket.socket]) -> None:
    token = admin.create_account("stalled-body")
    sock = connect(api, sockets, "127.0.0.8")
    size = 2 * MIB
    sock.sendall(_authorised_upload(api, token, b"Content-Length: %d\r\n" % size))
    sock.sendall(b'{"input": {"prompt": "' + b"x" * (size - 100))  # the rest never comes
    answer = read_to_end(sock)
    assert status_of(answer) in (408, None), answer


def test_a_dripping_chunked_body_is_ended(
    api: Api, admin: Admin, sockets: list[socket.socket]
) -> None:
    token = admin.create_account("dripping-body")
    sock = connect(api, sockets, "127.0.0.9")
    sock.sendall(_authorised_upload(api, token, b"Transfer-Encoding: chunked\r\n"))
    drips = 0
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while drips < 100 and not readable(sock):
            sock.sendall(b"1\r\nx\r\n")
            drips += 1
            pace(0.2)  # one byte every 0.2 s: far below the body's minimum rate
    assert drips < 100, f"a body dripping for {drips} bytes was still being read"
    answer = read_to_end(sock)
    assert status_of(answer) in (408, None), answer


def test_pipelined_requests_whose_answers_are_never_read_are_bounded(
    api: Api, sockets: list[socket.socket]
) -> None:
    sock = connect(api, sockets, "127.0.0.10")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    # Large answers (the OpenAPI document): the answers nobody reads fill the buffers soon.
    requests = b"GET /openapi.json HTTP/1.1\r\nHost: conduit\r\n\r\n" * 100_000
    reset_peak_rss(api.pid)
    before = peak_rss(api.pid)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            sock.sendall(requests)
            outcome.append(None)
        except OSError as error:
            outcome.append(error)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    # The api stops reading while answers wait, then drops the connection nobody reads from.
    wait_for(lambda: closed_by_peer(sock), "the api dropping the connection", timeout=PATIENCE)
    sender.join(PATIENCE)
    grown = peak_rss(api.pid) - before
    assert grown < 32 * MIB, f"the api grew by {grown / MIB:.0f} MiB"
    assert healthy(api, "127.0.0.10")


def test_an_unauthenticated_body_is_refused_before_it_is_read(
    api: Api, sockets: list[socket.socket]
) -> None:
    for authorization in (b"", b"Authorization: Bearer r8_" + b"A" * 40 + b"\r\n"):
        sock = connect(api, sockets, "127.0.0.11")
        sock.sendall(
            f"POST /v1/deployments/{ECHO}/predictions HTTP/1.1\r\nHost: conduit\r\n".encode()
            + authorization
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (5 * MIB)
        )
        answer = read_to_end(sock)  # no body sent: only an answer that reads none ends this
        assert status_of(answer) == 401, answer
        assert b"connection: close" in answer.lower()
        assert problem_of(answer)["status"] == 401


def test_an_authorised_body_and_the_open_routes_are_still_served(api: Api, admin: Admin) -> None:
    token = admin.create_account("served")
    with httpx.Client(base_url=api.url, timeout=PATIENCE) as client:
        created = client.post(
            f"/v1/deployments/{ECHO}/predictions",
            json={"input": {"prompt": "hi"}},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert created.status_code == 201, created.text
        assert client.get("/health").status_code == 200
        assert client.get("/openapi.json").status_code == 200
        assert client.get("/metrics").status_code == 200
        # A body the client sends slowly but steadily is read whole.
        body = orjson.dumps({"input": {"prompt": "x" * 4000}})

        def steady() -> Iterator[bytes]:
            for start in range(0, len(body), 500):
                pace(0.05)
                yield body[start : start + 500]

        slow = client.post(
            f"/v1/deployments/{ECHO}/predictions",
            content=steady(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert slow.status_code == 201, slow.text
