"""Large data URLs in an output already parsed (a Conduit runner's snapshot stream) go into the
store once each, however many cumulative snapshots repeat them."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterable
from dataclasses import dataclass, field

from director.output_files import DataUrlKeeper


@dataclass
class Kept:
    """Output files as a store keeps them: name, type and bytes, by URL."""

    files: dict[str, tuple[str, str, bytes]] = field(default_factory=dict)

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str:
        data = b"".join([chunk async for chunk in chunks])
        url = f"https://files/{prediction_id}/{len(self.files)}/{name}"
        self.files[url] = (name, content_type, data)
        return url


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def test_large_data_urls_anywhere_in_the_output_are_stored_once() -> None:
    kept = Kept()
    keeper = DataUrlKeeper(kept, 1, "p1", inline_max=100)
    big = bytes(range(256)) * 5000  # more than one decoded piece
    small = _url(b"s" * 100)
    output = [_url(big), {"nested": [small, _url(b"w" * 101, "audio/wav")]}, 3, None, "text"]
    first = await keeper.keep(output)
    assert first[2:] == [3, None, "text"] and first[1]["nested"][0] == small
    assert [(n, t, d) for n, t, d in kept.files.values()] == [
        ("out-1.png", "image/png", big),
        ("out-2.wav", "audio/wav", b"w" * 101),
    ]
    again = await keeper.keep([*output, _url(b"n" * 200)])  # the next cumulative snapshot
    assert again[:2] == first[:2] and len(kept.files) == 3


async def test_what_is_not_plain_base64_stays_as_it_was() -> None:
    kept = Kept()
    keeper = DataUrlKeeper(kept, 1, "p1", inline_max=10)
    odd = [
        "data:text/plain," + "x" * 100,
        "data:image/png;base64," + "A" * 99,
        "data:image/png;base64," + "A!" * 50,
        "see data:image/png;base64," + "A" * 100,
    ]
    assert await keeper.keep(odd) == odd and kept.files == {}
