"""Each process part renders with the links it was built with: two signers in one process (an
api and a director run side by side in tests, or two apps) never sign with each other's key."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from tracker.render import PredictionLinks, prediction_urls
from tracker.stream_urls import Signature, StreamSigner

BASE = "http://127.0.0.1:8000"


def _capability(url: str) -> tuple[str | None, str | None]:
    query = parse_qs(urlsplit(url).query)
    return query.get("exp", [None])[0], query.get("sig", [None])[0]


def test_each_links_signs_with_its_own_signer() -> None:
    first = StreamSigner(key=b"a" * 32)
    second = StreamSigner(key=b"b" * 32)
    signed_first = prediction_urls(PredictionLinks(BASE, first), "p1")["stream"]
    signed_second = prediction_urls(PredictionLinks(BASE, second), "p1")["stream"]
    plain = prediction_urls(PredictionLinks(BASE), "p1")["stream"]

    assert first.verify("p1", *_capability(signed_first)) is Signature.VALID
    assert second.verify("p1", *_capability(signed_first)) is Signature.FORGED
    assert second.verify("p1", *_capability(signed_second)) is Signature.VALID
    assert plain == f"{BASE}/v1/predictions/p1/stream"


def test_a_signer_without_a_key_yet_gives_the_plain_url() -> None:
    urls = prediction_urls(PredictionLinks(BASE, StreamSigner()), "p2")
    assert urls == {
        "get": f"{BASE}/v1/predictions/p2",
        "cancel": f"{BASE}/v1/predictions/p2/cancel",
        "stream": f"{BASE}/v1/predictions/p2/stream",
    }
