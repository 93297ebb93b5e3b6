"""Work grouped per Redis Cluster hash tag: a script call or a multi-key read never spans slots.

Keys with equal tags (``tracker.keys.slot_tag``) share a slot. On a single Redis the grouping
costs nothing that matters (a deployable's keys share one tag anyway); in a cluster it is what
keeps every script call and multi-key command within one slot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Generic, TypeVar

from tracker.group_commit import Batcher
from tracker.keys import slot_tag

Item = TypeVar("Item")
Result = TypeVar("Result")


class PerSlot(Generic[Item, Result]):
    """A :class:`Batcher` per hash tag: a batch, and so a script call, never spans slots."""

    def __init__(
        self,
        write: Callable[[list[Item]], Awaitable[Sequence[Result]]],
        key_of: Callable[[Item], str],
    ) -> None:
        self._write = write
        self._key_of = key_of
        self._batchers: dict[str, Batcher[Item, Result]] = {}

    async def submit(self, item: Item) -> Result:
        tag = slot_tag(self._key_of(item))
        batcher = self._batchers.get(tag)
        if batcher is None:
            batcher = self._batchers[tag] = Batcher(self._write)
        return await batcher.submit(item)

    async def close(self) -> None:
        for batcher in list(self._batchers.values()):
            await batcher.close()


def runs_by_slot(keys: Sequence[str]) -> list[list[str]]:
    """``keys`` cut into consecutive runs of one hash tag, order kept."""
    runs: list[list[str]] = []
    for key in keys:
        if runs and slot_tag(runs[-1][0]) == slot_tag(key):
            runs[-1].append(key)
        else:
            runs.append([key])
    return runs


def by_slot(keys: Iterable[str]) -> dict[str, list[str]]:
    """``keys`` grouped by hash tag (first-seen order of tags and of keys kept)."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(slot_tag(key), []).append(key)
    return groups
