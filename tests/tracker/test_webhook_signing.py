"""Standard Webhooks signing, checked by the reference ``standardwebhooks`` verifier."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from core import backoff as backoff_module
from core.ids import new_webhook_secret
from core.ssrf import parse_cidrs
from tracker.webhooks import USER_AGENT, WebhookPolicy, open_session, post, sign

BODY = json.dumps({"id": "abc", "status": "succeeded", "output": ["héllo"]}, ensure_ascii=False)


def test_signature_verifies() -> None:
    secret = new_webhook_secret()
    headers = sign(secret, "msg_1", BODY)
    assert Webhook(secret).verify(BODY, headers) == json.loads(BODY)
    assert headers["webhook-id"] == "msg_1"
    assert headers["webhook-signature"].startswith("v1,")


@pytest.mark.parametrize("zone", [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7))])
def test_signature_covers_the_header_timestamp_in_any_zone(zone: timezone) -> None:
    when = datetime.now(zone)  # taken now, not at collection: the verifier rejects old stamps
    secret = new_webhook_secret()
    headers = sign(secret, "msg_1", BODY, when)
    assert headers["webhook-timestamp"] == str(int(when.timestamp()))
    Webhook(secret).verify(BODY, headers)


def test_tampering_is_rejected() -> None:
    secret = new_webhook_secret()
    headers = sign(secret, "msg_1", BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace("succeeded", "failed"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, {**headers, "webhook-id": "msg_2"})
    with pytest.raises(WebhookVerificationError):
        Webhook(new_webhook_secret()).verify(BODY, headers)


async def test_delivered_request_verifies_against_the_account_secret() -> None:
    secret = new_webhook_secret()
    received: list[tuple[CIMultiDict[str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        received.append((CIMultiDict(request.headers), await request.read()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", handle)
    policy = WebhookPolicy(allow=parse_cidrs("127.0.0.0/8"))
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        async with open_session(policy) as session:
            url = f"http://127.0.0.1:{server.port}/hook"
            assert await post(session, policy, url, "msg_42", secret, BODY) == 204

    [(headers, body)] = received
    assert headers["webhook-id"] == "msg_42"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == USER_AGENT
    payload = Webhook(secret).verify(body, dict(headers))
    assert payload == json.loads(BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_webhook_secret()).verify(body, dict(headers))


@pytest.mark.parametrize("draw", ["low", "high"])
def test_retries_span_at_least_a_day_whatever_the_jitter(
    draw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver down for a whole day still gets its ``completed`` webhook: even with every
    jitter draw at its extreme the retries cover 24 hours."""
    pick = (lambda low, high: low) if draw == "low" else (lambda low, high: high)
    monkeypatch.setattr(backoff_module.random, "uniform", pick)
    policy = WebhookPolicy()
    delays = [policy.retry_delay(n) for n in range(1, len(policy.schedule) + 2)]
    assert delays[-1] is None  # out of tries after the schedule
    waits = [d for d in delays if d is not None]
    assert len(waits) == len(policy.schedule)
    assert sum(waits) >= 86_400
    assert all(w >= base for w, base in zip(waits, policy.schedule, strict=True))
