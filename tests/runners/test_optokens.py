"""Operation tokens: every rejection reason, the check order, replay (in memory and shared
through a real Redis), tokens bound to one runner, and the CLI that mints them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from core.ports import free_port
from runners.control_errors import (
    BadSignatureError,
    InsufficientSignersError,
    MalformedOpTokenError,
    ModelMismatchError,
    NonceStoreUnavailableError,
    OperationMismatchError,
    OpTokenError,
    OutsideValidityWindowError,
    ReplayedNonceError,
    RunnerMismatchError,
)
from runners.errors import RequestRefused
from runners.nonces import MemoryNonceStore, RedisNonceStore, nonce_key
from runners.optokens import OpTokenVerifier, issue, read_key

ROOT = Path(__file__).resolve().parents[2]
KEY = b"test-op-token-key-\x00\xff"
NOW = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)
MODEL = "acme/llm"
SIGNERS = ["alice", "bob", "carol"]


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def verifier(min_signers: int = 2, clock: Clock | None = None, **kw: Any) -> OpTokenVerifier:
    return OpTokenVerifier(KEY, SIGNERS, min_signers, clock=clock or Clock(), **kw)


def decode(token: str) -> dict[str, Any]:
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    envelope: dict[str, Any] = json.loads(raw)
    return envelope


def encode(envelope: dict[str, Any]) -> str:
    raw = json.dumps(envelope).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signed(body: dict[str, Any], key: bytes = KEY) -> str:
    """A token for an arbitrary body, signed exactly as the spec says (independent of issue())."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    return encode({"opToken": body, "signature": signature})


def good_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = decode(issue(KEY, "model-load", MODEL, ["alice", "bob"], NOW))["opToken"]
    body.update(changes)
    return body


# --- wire format and acceptance -------------------------------------------------------------


def test_issued_token_has_the_documented_wire_format() -> None:
    token = issue(KEY, "model-load", MODEL, ["alice", "bob"], NOW)
    assert "=" not in token
    envelope = decode(token)
    body = envelope["opToken"]
    assert set(envelope) == {"opToken", "signature"}
    assert body["operation"] == "model-load"
    assert body["modelId"] == MODEL
    assert body["issuedAt"] == int(NOW.timestamp())  # epoch seconds, as the spec writes it
    assert body["signers"] == ["alice", "bob"]
    assert len(body["nonce"]) >= 32 and int(body["nonce"], 16) >= 0
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert envelope["signature"] == hmac.new(KEY, canonical, hashlib.sha256).hexdigest()


def test_nonces_differ_between_tokens() -> None:
    first, second = (issue(KEY, "cache-flush", None, ["alice"], NOW) for _ in range(2))
    assert decode(first)["opToken"]["nonce"] != decode(second)["opToken"]["nonce"]


async def test_accepts_exactly_m_of_n_signers() -> None:
    token = issue(KEY, "model-load", MODEL, ["alice", "carol"], NOW)
    op_token = await verifier(min_signers=2).verify(token, "model-load", MODEL)
    assert op_token.operation == "model-load"
    assert op_token.model_id == MODEL
    assert op_token.issued_at == NOW
    assert op_token.signers == ("alice", "carol")


async def test_accepts_a_token_without_a_model_for_a_call_without_one() -> None:
    token = issue(KEY, "cache-flush", None, ["bob"], NOW)
    assert (await verifier(min_signers=1).verify(token, "cache-flush", None)).model_id is None


async def test_accepts_padded_input() -> None:
    token = issue(KEY, "model-unload", MODEL, SIGNERS, NOW)
    padded = token + "=" * (-len(token) % 4)
    assert (await verifier().verify(padded, "model-unload", MODEL)).nonce


# --- one test per rejection reason ----------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not base64!",
        "a",
        encode({"opToken": good_body()}),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        base64.urlsafe_b64encode(b'{"opToken": {}, "signature": "x", "signature": "y"}').decode(),
        base64.urlsafe_b64encode(b"[" * 5000).decode(),
        signed(good_body(extra=1)),
        signed({k: v for k, v in good_body().items() if k != "nonce"}),
        signed(good_body(operation="reboot")),
        signed(good_body(modelId=7)),
        signed(good_body(signers="alice,bob")),
        signed(good_body(signers=["alice", 2])),
        signed(good_body(nonce="abc")),
        signed(good_body(nonce="Z" * 32)),
        signed(good_body(issuedAt="yesterday")),
        signed(good_body(issuedAt="2026-11-22T03:00:00")),
        signed(good_body(issuedAt=True)),
        signed(good_body(issuedAt=[1795316400])),
        signed(good_body(issuedAt=10**20)),
        signed(good_body(runnerId=None)),
        signed(good_body(runnerId=7)),
        signed(good_body(runnerId="")),
        encode({"opToken": good_body(), "signature": 1}),
        "A" * 9000,
    ],
)
async def test_rejects_malformed_tokens(token: str) -> None:
    with pytest.raises(MalformedOpTokenError):
        await verifier().verify(token, "model-load", MODEL)


async def test_rejects_a_tampered_body() -> None:
    envelope = decode(issue(KEY, "model-load", MODEL, ["alice"], NOW))
    envelope["opToken"]["signers"].append("bob")
    with pytest.raises(BadSignatureError):
        await verifier().verify(encode(envelope), "model-load", MODEL)


async def test_rejects_a_tampered_signature() -> None:
    envelope = decode(issue(KEY, "model-load", MODEL, SIGNERS, NOW))
    envelope["signature"] = envelope["signature"][:-1] + (
        "0" if envelope["signature"][-1] != "0" else "1"
    )
    with pytest.raises(BadSignatureError):
        await verifier().verify(encode(envelope), "model-load", MODEL)


async def test_rejects_a_token_signed_with_another_key() -> None:
    token = issue(b"another key", "model-load", MODEL, SIGNERS, NOW)
    with pytest.raises(BadSignatureError):
        await verifier().verify(token, "model-load", MODEL)


@pytest.mark.parametrize("issued_at", [NOW.timestamp(), int(NOW.timestamp()), "2026-11-22T03:00Z"])
async def test_issued_at_as_epoch_seconds_or_iso_8601(issued_at: float | str) -> None:
    """The spec writes ``issuedAt`` as epoch seconds; ISO 8601 with a zone stays accepted."""
    verified = await verifier().verify(signed(good_body(issuedAt=issued_at)), "model-load", MODEL)
    assert verified.issued_at == NOW


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [
        (timedelta(minutes=4, seconds=59), True),
        (timedelta(minutes=5), True),
        (timedelta(minutes=5, seconds=1), False),
        (-timedelta(minutes=4, seconds=59), True),
        (-timedelta(minutes=5), True),
        (-timedelta(minutes=5, seconds=1), False),
    ],
)
async def test_clock_skew_edges(offset: timedelta, accepted: bool) -> None:
    """Positive offset: the verifier's clock is ahead (an old token); negative: a future token."""
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW)
    check = verifier(clock=Clock(NOW + offset))
    if accepted:
        await check.verify(token, "model-load", MODEL)
    else:
        with pytest.raises(OutsideValidityWindowError):
            await check.verify(token, "model-load", MODEL)


async def test_the_window_is_configurable() -> None:
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW)
    check = verifier(clock=Clock(NOW + timedelta(seconds=31)), max_skew=timedelta(seconds=30))
    with pytest.raises(OutsideValidityWindowError):
        await check.verify(token, "model-load", MODEL)


async def test_rejects_another_operation() -> None:
    token = issue(KEY, "model-unload", MODEL, SIGNERS, NOW)
    with pytest.raises(OperationMismatchError):
        await verifier().verify(token, "model-load", MODEL)


@pytest.mark.parametrize(("token_model", "requested"), [("acme/other", MODEL), (None, MODEL)])
async def test_rejects_another_model(token_model: str | None, requested: str) -> None:
    token = issue(KEY, "model-load", token_model, SIGNERS, NOW)
    with pytest.raises(ModelMismatchError):
        await verifier().verify(token, "model-load", requested)


@pytest.mark.parametrize(
    "signers",
    [
        [],
        ["alice"],
        ["alice", "alice"],
        ["alice", "mallory", "eve"],
        ["Alice", "BOB"],
    ],
)
async def test_rejects_too_few_configured_signers(signers: list[str]) -> None:
    token = issue(KEY, "model-load", MODEL, signers, NOW)
    with pytest.raises(InsufficientSignersError):
        await verifier(min_signers=2).verify(token, "model-load", MODEL)


async def test_rejects_a_replay() -> None:
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW)
    check = verifier()
    await check.verify(token, "model-load", MODEL)
    with pytest.raises(ReplayedNonceError):
        await check.verify(token, "model-load", MODEL)


async def test_a_rejected_token_does_not_burn_its_nonce() -> None:
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW)
    check = verifier()
    for operation, model in [("model-unload", MODEL), ("model-load", "acme/other")]:
        with pytest.raises(OpTokenError):
            await check.verify(token, operation, model)
    assert (await check.verify(token, "model-load", MODEL)).operation == "model-load"


async def test_checks_run_in_the_documented_order() -> None:
    """A token wrong in every way is refused for the earliest check: signature, then time..."""
    stale_everything = issue(b"another key", "model-unload", "acme/other", [], NOW)
    check = verifier(clock=Clock(NOW + timedelta(hours=1)))
    with pytest.raises(BadSignatureError):
        await check.verify(stale_everything, "model-load", MODEL)
    stale = issue(KEY, "model-unload", "acme/other", [], NOW)
    with pytest.raises(OutsideValidityWindowError):
        await check.verify(stale, "model-load", MODEL)
    wrong_op = issue(KEY, "model-unload", "acme/other", [], NOW)
    with pytest.raises(OperationMismatchError):
        await verifier().verify(wrong_op, "model-load", MODEL)
    wrong_model = issue(KEY, "model-load", "acme/other", [], NOW)
    with pytest.raises(ModelMismatchError):
        await verifier().verify(wrong_model, "model-load", MODEL)


def test_every_rejection_is_a_runner_error() -> None:
    for error in (
        MalformedOpTokenError,
        BadSignatureError,
        OutsideValidityWindowError,
        OperationMismatchError,
        ModelMismatchError,
        RunnerMismatchError,
        InsufficientSignersError,
        ReplayedNonceError,
    ):
        assert issubclass(error, OpTokenError) and issubclass(error, RequestRefused)


# --- tokens bound to one runner -------------------------------------------------------------


def test_a_token_names_its_runner_only_when_asked() -> None:
    assert "runnerId" not in decode(issue(KEY, "model-load", MODEL, SIGNERS, NOW))["opToken"]
    body = decode(issue(KEY, "model-load", MODEL, SIGNERS, NOW, runner_id="gpu-7"))["opToken"]
    assert body["runnerId"] == "gpu-7"


async def test_a_runner_bound_token_is_accepted_by_that_runner_only() -> None:
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW, runner_id="gpu-7")
    for other in ("gpu-8", "GPU-7", None):
        with pytest.raises(RunnerMismatchError) as refused:
            await verifier(runner_id=other).verify(token, "model-load", MODEL)
        assert (refused.value.status, refused.value.code) == (403, "runner-mismatch")
    assert (await verifier(runner_id="gpu-7").verify(token, "model-load", MODEL)).runner_id == (
        "gpu-7"
    )


async def test_an_unbound_token_is_accepted_by_any_runner() -> None:
    token = issue(KEY, "model-load", MODEL, SIGNERS, NOW)
    assert (await verifier(runner_id="gpu-8").verify(token, "model-load", MODEL)).runner_id is None


async def test_a_token_for_another_runner_is_refused_before_signers_and_burns_no_nonce() -> None:
    check = verifier(runner_id="gpu-8")
    token = issue(KEY, "model-load", MODEL, ["alice"], NOW, runner_id="gpu-7")
    with pytest.raises(RunnerMismatchError):
        await check.verify(token, "model-load", MODEL)
    assert isinstance(check.nonces, MemoryNonceStore) and len(check.nonces) == 0


# --- nonce store ----------------------------------------------------------------------------


async def test_nonce_store_forgets_expired_nonces() -> None:
    store = MemoryNonceStore()
    assert await store.add("a", NOW + timedelta(minutes=1), NOW)
    assert await store.add("b", NOW + timedelta(minutes=3), NOW)
    assert not await store.add("a", NOW + timedelta(minutes=1), NOW + timedelta(seconds=59))
    assert len(store) == 2
    store.forget_expired(NOW + timedelta(minutes=1))
    assert len(store) == 1
    assert await store.add("a", NOW + timedelta(minutes=5), NOW + timedelta(minutes=1))
    store.forget_expired(NOW + timedelta(minutes=10))
    assert len(store) == 0


async def test_verifier_remembers_a_nonce_for_the_window_and_margin_only() -> None:
    clock = Clock()
    check = verifier(clock=clock, nonce_margin=timedelta(seconds=30))
    assert isinstance(check.nonces, MemoryNonceStore)
    await check.verify(issue(KEY, "model-load", MODEL, SIGNERS, NOW), "model-load", MODEL)
    clock.now = NOW + timedelta(minutes=5, seconds=29)
    check.nonces.forget_expired(clock.now)
    assert len(check.nonces) == 1
    clock.now = NOW + timedelta(minutes=5, seconds=30)
    await check.verify(issue(KEY, "model-load", MODEL, SIGNERS, clock.now), "model-load", MODEL)
    assert len(check.nonces) == 1


async def test_replay_is_refused_across_verifiers_sharing_redis(redis_url: str) -> None:
    """Two replicas (or a runner and its restarted self), each with its own connection."""
    stores = [RedisNonceStore.from_url(redis_url) for _ in range(2)]
    first, second = (OpTokenVerifier(KEY, SIGNERS, 2, nonce_store=store) for store in stores)
    try:
        token = issue(KEY, "model-load", MODEL, SIGNERS)  # now: Redis expires keys by its clock
        accepted = await first.verify(token, "model-load", MODEL)
        with pytest.raises(ReplayedNonceError):
            await second.verify(token, "model-load", MODEL)
        with pytest.raises(ReplayedNonceError):
            await first.verify(token, "model-load", MODEL)
        async with Redis.from_url(redis_url) as redis:
            ttl_ms = await redis.pttl(nonce_key(accepted.nonce))
        window = first.max_skew + first.nonce_margin
        assert timedelta(0) < timedelta(milliseconds=ttl_ms) <= window
        assert nonce_key(accepted.nonce) == f"optoken:nonce:{accepted.nonce}"
    finally:
        for store in stores:
            await store.aclose()


async def test_a_refused_token_records_no_nonce_in_redis(redis_url: str) -> None:
    store = RedisNonceStore.from_url(redis_url)
    check = OpTokenVerifier(KEY, SIGNERS, 2, runner_id="gpu-8", nonce_store=store)
    try:
        token = issue(KEY, "model-load", MODEL, SIGNERS, runner_id="gpu-7")
        with pytest.raises(RunnerMismatchError):
            await check.verify(token, "model-load", MODEL)
        async with Redis.from_url(redis_url) as redis:
            assert not await redis.exists(nonce_key(decode(token)["opToken"]["nonce"]))
    finally:
        await store.aclose()


async def test_an_unreachable_redis_refuses_the_call() -> None:
    """No lifecycle call runs without replay protection: 503, not an accepted token."""
    store = RedisNonceStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
    check = OpTokenVerifier(KEY, SIGNERS, 2, nonce_store=store)
    try:
        with pytest.raises(NonceStoreUnavailableError) as refused:
            await check.verify(issue(KEY, "model-load", MODEL, SIGNERS), "model-load", MODEL)
        assert (refused.value.status, refused.value.code) == (503, "nonce-store-unavailable")
    finally:
        await store.aclose()


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(("signers", "min_signers"), [(SIGNERS, 0), (SIGNERS, 4), ([], 1)])
def test_refuses_a_configuration_no_token_could_pass(signers: list[str], min_signers: int) -> None:
    with pytest.raises(ValueError):
        OpTokenVerifier(KEY, signers, min_signers)


def test_refuses_an_empty_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        OpTokenVerifier(b"", SIGNERS)
    (tmp_path / "key").write_bytes(b"\n")
    with pytest.raises(ValueError):
        read_key(tmp_path / "key")


def test_read_key_strips_one_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"secret \n\n")
    assert read_key(path) == b"secret \n"
    path.write_bytes(b"secret\r\n")
    assert read_key(path) == b"secret"


async def test_from_env(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(KEY + b"\n")
    check = OpTokenVerifier.from_env(
        {
            "VERIFIED_OP_TOKEN_KEY_PATH": str(tmp_path / "key"),
            "OP_TOKEN_SIGNERS": "alice, bob ,carol",
            "OP_TOKEN_MIN_SIGNERS": "3",
        }
    )
    assert check.signers == frozenset(SIGNERS)
    assert check.min_signers == 3
    with pytest.raises(InsufficientSignersError):
        await check.verify(issue(KEY, "cache-flush", None, ["alice", "bob"]), "cache-flush", None)
    await check.verify(issue(KEY, "cache-flush", None, SIGNERS), "cache-flush", None)


def test_from_env_defaults_to_one_signer(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(KEY)
    env = {"VERIFIED_OP_TOKEN_KEY_PATH": str(tmp_path / "key"), "OP_TOKEN_SIGNERS": "alice"}
    assert OpTokenVerifier.from_env(env).min_signers == 1
    with pytest.raises(ValueError):
        OpTokenVerifier.from_env({"OP_TOKEN_SIGNERS": "alice"})


# --- CLI ------------------------------------------------------------------------------------


async def test_cli_mints_a_token_the_verifier_accepts(tmp_path: Path) -> None:
    key_file = tmp_path / "op-token.key"
    key_file.write_bytes(KEY + b"\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "conduit", "admin", "op-token", "--operation", "model-load"]
    command += ["--model", MODEL, "--signers", "alice,bob", "--key-file", str(key_file)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert len(done.stdout.splitlines()) == 1
    op_token = await OpTokenVerifier(KEY, SIGNERS, 2).verify(token, "model-load", MODEL)
    assert op_token.signers == ("alice", "bob")
    assert op_token.runner_id is None
    assert abs(datetime.now(UTC) - op_token.issued_at) < timedelta(minutes=1)


async def test_cli_mints_a_token_for_one_runner(tmp_path: Path) -> None:
    key_file = tmp_path / "op-token.key"
    key_file.write_bytes(KEY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "conduit", "admin", "op-token", "--operation", "cache-flush"]
    command += ["--signers", "alice,bob", "--key-file", str(key_file), "--runner", "gpu-7"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    with pytest.raises(RunnerMismatchError):
        await OpTokenVerifier(KEY, SIGNERS, 2, runner_id="gpu-8").verify(token, "cache-flush", None)
    verified = await OpTokenVerifier(KEY, SIGNERS, 2, runner_id="gpu-7").verify(
        token, "cache-flush", None
    )
    assert verified.runner_id == "gpu-7"
