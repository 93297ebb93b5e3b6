"""The webhook scanner takes large data URLs out of a snapshot's output, wherever the body's
chunks happen to split it, and leaves every other byte as it was (the input echo dropped)."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from director.snapshot_events import Event, FileBytes, FileEnd, FileStart, ScanError, Text
from director.snapshot_files import SnapshotScanner

Splitter = Callable[[bytes], Iterator[bytes]]


def whole(body: bytes) -> Iterator[bytes]:
    yield body


def bytewise(body: bytes) -> Iterator[bytes]:
    for i in range(len(body)):
        yield body[i : i + 1]


def randomly(seed: int, most: int = 97) -> Splitter:
    def split(body: bytes) -> Iterator[bytes]:
        chooser = random.Random(seed)
        i = 0
        while i < len(body):
            n = chooser.randint(1, most)
            yield body[i : i + n]
            i += n

    return split


SPLITS: list[Splitter] = [whole, bytewise, *(randomly(seed) for seed in range(6))]


@dataclass
class Scanned:
    body: bytes
    files: list[tuple[FileStart, bytes]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


def scan(body: bytes, inline_max: int | None, split: Splitter = whole) -> Scanned:
    """Drive the scanner as the receiver does: each file's URL is ``stored:<n>``."""
    scanner = SnapshotScanner(inline_max)
    events: list[Event] = []
    for chunk in split(body):
        events += scanner.feed(chunk)
    events += scanner.close()
    scanned = Scanned(b"")
    reduced = bytearray()
    current: tuple[FileStart, bytearray] | None = None
    for event in events:
        if isinstance(event, Text):
            assert current is None, "text inside a file"
            reduced += event.data
        elif isinstance(event, FileStart):
            assert current is None
            current = (event, bytearray())
        elif isinstance(event, FileBytes):
            assert current is not None
            current[1].extend(event.data)
        else:
            assert isinstance(event, FileEnd) and current is not None
            scanned.files.append((current[0], bytes(current[1])))
            reduced += json.dumps(f"stored:{len(scanned.files)}").encode()
            current = None
    assert current is None
    scanned.body = bytes(reduced)
    return scanned


def data_url(data: bytes, mime: str = "image/png", params: str = "") -> str:
    return f"data:{mime}{params};base64,{base64.b64encode(data).decode()}"


def body_of(**snapshot: Any) -> bytes:
    return json.dumps({"id": "p1", "status": "succeeded", **snapshot}).encode()


@pytest.mark.parametrize("split", SPLITS)
def test_a_large_data_url_becomes_a_file_and_the_rest_passes_byte_for_byte(
    split: Splitter,
) -> None:
    image = bytes(random.Random(1).randbytes(5000))
    body = body_of(output=data_url(image), logs="done\n", metrics={"predict_time": 1.5})
    scanned = scan(body, 100, split)
    assert scanned.json() == {
        "id": "p1",
        "status": "succeeded",
        "output": "stored:1",
        "logs": "done\n",
        "metrics": {"predict_time": 1.5},
    }
    [(start, stored)] = scanned.files
    assert (start.content_type, start.name, stored) == ("image/png", "out-1.png", image)


@pytest.mark.parametrize("split", SPLITS)
def test_the_input_echo_is_dropped_whatever_it_holds(split: Splitter) -> None:
    echo = {"prompt": 'say "hi" \\ {not [a] bracket}', "image": data_url(b"x" * 500), "n": [1, {}]}
    body = json.dumps({"input": echo, "output": ["a"], "status": "processing"}).encode()
    scanned = scan(body, 10, split)
    assert scanned.json() == {"input": None, "output": ["a"], "status": "processing"}
    assert scanned.files == []  # data URLs in the input are never stored
    for scalar in ("12.5", "true", '"text"', "null"):
        body = f'{{"input" : {scalar} , "output": 1}}'.encode()
        assert scan(body, 10, split).json() == {"input": None, "output": 1}


@pytest.mark.parametrize("split", SPLITS)
def test_nested_outputs_small_and_large(split: Splitter) -> None:
    big, small = b"B" * 300, b"s" * 10
    output = {
        "images": [data_url(big, "image/jpeg"), data_url(small, "image/jpeg")],
        "deep": [[{"audio": data_url(big + b"2", "audio/wav", ";rate=44100")}]],
        "plain": "data:text/plain,not%20base64",
        "number": 3,
    }
    scanned = scan(body_of(output=output), 10, split)
    assert scanned.json()["output"] == {
        "images": ["stored:1", data_url(small, "image/jpeg")],
        "deep": [[{"audio": "stored:2"}]],
        "plain": "data:text/plain,not%20base64",
        "number": 3,
    }
    assert [(s.content_type, s.name, len(d)) for s, d in scanned.files] == [
        ("image/jpeg", "out-1.jpg", 300),
        ("audio/wav", "out-2.wav", 301),
    ]
    assert scanned.files[1][1] == big + b"2"


@pytest.mark.parametrize("split", SPLITS)
def test_exactly_inline_max_stays_inline_one_more_byte_is_a_file(split: Splitter) -> None:
    for size in range(40, 52):  # every padding
        at_most = scan(body_of(output=[data_url(b"z" * size)]), size, split)
        assert at_most.json()["output"] == [data_url(b"z" * size)] and not at_most.files
        past = scan(body_of(output=[data_url(b"z" * (size + 1))]), size, split)
        assert past.json()["output"] == ["stored:1"]
        assert past.files[0][1] == b"z" * (size + 1)


@pytest.mark.parametrize("split", SPLITS)
def test_data_urls_outside_the_output_or_inside_other_strings_stay(split: Splitter) -> None:
    url = data_url(b"q" * 200)
    body = body_of(
        output=[f'"{url}', f"see {url}", f" {url}"],
        logs=f'"{url}" \\"data: {url}',
        error=url,
    )
    scanned = scan(body, 10, split)
    assert scanned.json() == json.loads(body)
    assert scanned.files == []


@pytest.mark.parametrize("split", SPLITS)
def test_escapes_and_unicode_around_files(split: Splitter) -> None:
    text = 'line\n\t"quoted" \\ back\\slash \u00e9\u2603 \U0001f600 \\"data:'
    body = json.dumps(
        {"logs": text, "output": [text, data_url(b"\x00" * 64), text], "error": None},
        ensure_ascii=False,
    ).encode()
    scanned = scan(body, 8, split)
    assert scanned.json() == {"logs": text, "output": [text, "stored:1", text], "error": None}
    assert scanned.files[0][1] == b"\x00" * 64
    ascii_body = json.dumps({"output": [text, data_url(b"\x01" * 64)]}).encode()
    assert scan(ascii_body, 8, split).json()["output"] == [text, "stored:1"]


def test_without_a_store_every_data_url_stays_inline() -> None:
    url = data_url(b"k" * 10_000)
    scanned = scan(body_of(output=[url], input={"a": url}), None)
    assert scanned.json()["output"] == [url] and scanned.json()["input"] is None
    assert scanned.files == []


def test_an_escaped_slash_or_a_long_header_keeps_the_string_inline() -> None:
    payload = base64.b64encode(b"m" * 100).decode()
    escaped = '{"output": "data:image\\/png;base64,' + payload + '"}'
    assert scan(escaped.encode(), 10).json()["output"] == f"data:image/png;base64,{payload}"
    long_header = data_url(b"m" * 100, "image/png", ";x=" + "y" * 300)
    assert scan(body_of(output=long_header), 10).files == []
    unpadded = "data:a/b;base64," + payload.rstrip("=") + "Q"  # 4n+1 characters
    assert scan(body_of(output=unpadded), 1000).json()["output"] == unpadded


def test_unpadded_payloads_decode() -> None:
    for size in (100, 101, 102):
        url = data_url(b"u" * size).rstrip("=")
        assert scan(body_of(output=url), 10).files[0][1] == b"u" * size


def test_the_type_decides_the_name_and_odd_types_still_store() -> None:
    urls = [
        data_url(b"a" * 50, t) for t in ("", "application/x-unknown", "IMAGE/PNG", "text/plain")
    ]
    names = [(s.content_type, s.name) for s, _ in scan(body_of(output=urls), 10).files]
    assert names == [
        ("application/octet-stream", "out-1.bin"),
        ("application/x-unknown", "out-2.bin"),
        ("image/png", "out-3.png"),
        ("text/plain", "out-4.txt"),
    ]


def test_a_large_file_is_streamed_not_held() -> None:
    """Each chunk's bytes come out with that chunk: nothing waits for the string's end."""
    image = random.Random(2).randbytes(3 * 1024 * 1024)
    body = body_of(output=[data_url(image)])
    scanner = SnapshotScanner(1024)
    seen = bytearray()
    largest = 0
    for i in range(0, len(body), 65536):
        for event in scanner.feed(body[i : i + 65536]):
            if isinstance(event, FileBytes):
                seen += event.data
                largest = max(largest, len(event.data))
    scanner.close()
    assert bytes(seen) == image
    assert largest <= 65536


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[1, 2]",
        b'"text"',
        b'{"output": [1, 2}',
        b'{"output": {"a": 1]}',
        b'{"output": "unterminated',
        b'{"output": [1, 2]',
        b'{"status": "ok"} trailing',
        b'{"status": "ok"}}',
        b"{'single': 1}",
    ],
)
def test_malformed_json_is_reported_not_crashed_on(body: bytes) -> None:
    scanner = SnapshotScanner(10)
    with pytest.raises(ScanError):
        for i in range(len(body)):
            scanner.feed(body[i : i + 1])
        scanner.close()


def test_a_large_data_url_that_is_not_base64_is_reported() -> None:
    bad = "data:image/png;base64," + "A" * 400 + "!" + "A" * 3
    with pytest.raises(ScanError, match="not valid base64"):
        scan(body_of(output=bad), 10)
    after_padding = "data:image/png;base64," + "AA==" * 100
    with pytest.raises(ScanError, match="base64"):
        scan(body_of(output=after_padding), 10)


def test_a_bad_small_data_url_stays_as_it_is() -> None:
    for bad in ("data:image/png;base64,AAA!", "data:image/png;base64,A", "data:x;base64,AA==AA"):
        assert scan(body_of(output=[bad]), 1000).json()["output"] == [bad]


def _wrapped(data: bytes, width: int = 76) -> str:
    """Base64 of ``data`` as some encoders write it: escaped slashes, lines of ``width``."""
    encoded = base64.b64encode(data).decode()
    lines = [encoded[at : at + width] for at in range(0, len(encoded), width)]
    return "\\r\\n".join(lines).replace("/", "\\/")


@pytest.mark.parametrize("split", SPLITS)
def test_json_escapes_inside_a_large_payload_are_read(split: Splitter) -> None:
    image = random.Random(4).randbytes(3000)
    assert b"/" in base64.b64encode(image)
    body = '{"status": "succeeded", "output": ["data:image/png;base64,' + _wrapped(image)
    body += '", "x\\"y"], "logs": "a\\\\b"}'
    scanned = scan(body.encode(), 100, split)
    [(start, stored)] = scanned.files
    assert (start.content_type, stored) == ("image/png", image)
    assert scanned.json()["output"] == ["stored:1", 'x"y']
    assert scanned.json()["logs"] == "a\\b"


@pytest.mark.parametrize("split", SPLITS)
def test_a_small_payload_with_escapes_stays_as_it_was_sent(split: Splitter) -> None:
    small = "data:text/plain;base64," + _wrapped(b"?>?>?>" * 4, 8)
    other = 'data:text/plain;base64,QUFB\\"QUFB'  # an escape base64 does not hold
    body = ('{"output": ["' + small + '", "' + other + '"]}').encode()
    scanned = scan(body, 1000, split)
    assert scanned.files == []
    assert scanned.body == body
