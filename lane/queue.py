"""One deployment's bounded fair queue: strict priority bands, round-robin across accounts
inside a band, FIFO within an account.

Round-robin over accounts (not FIFO over requests) is what keeps a light account's wait short
while a heavy one floods the deployment: the light account's next request is at most one turn
of the ring away, however many the heavy one queued. The bounds themselves (``max_queue``, the
per-account share, ``tracker.waiter_shares.account_cap``) are the core's to apply; this class
only counts and orders.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Band:
    ring: deque[str] = field(default_factory=deque)
    """Accounts with requests in this band, the one served next first."""
    waiting: dict[str, deque[str]] = field(default_factory=dict)
    """Each account's request ids, oldest first."""


class FairQueue:
    def __init__(self) -> None:
        self._bands: dict[int, _Band] = {}
        self._where: dict[str, tuple[int, str]] = {}
        """request id → (band, account)."""
        self._per_account: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._where

    def count(self, account: str) -> int:
        """Places ``account`` holds, across bands."""
        return self._per_account.get(account, 0)

    def accounts(self) -> dict[str, int]:
        return dict(self._per_account)

    def push(self, request_id: str, account: str, band: int) -> None:
        if request_id in self._where:
            raise ValueError(f"{request_id!r} is already queued")
        queue = self._bands.setdefault(band, _Band())
        mine = queue.waiting.get(account)
        if mine is None:
            mine = queue.waiting[account] = deque()
            queue.ring.append(account)
        mine.append(request_id)
        self._where[request_id] = (band, account)
        self._per_account[account] = self._per_account.get(account, 0) + 1

    def pop(self) -> str | None:
        """The next request in dispatch order, removed; None when empty."""
        if not self._bands:
            return None
        band = min(self._bands)
        queue = self._bands[band]
        account = queue.ring[0]
        request_id = queue.waiting[account][0]
        self.remove(request_id)
        if account in queue.waiting:
            # Served: the account goes to the back of the ring.
            queue.ring.rotate(-1)
        return request_id

    def remove(self, request_id: str) -> bool:
        """Take ``request_id`` out wherever it is; False when it is not queued."""
        place = self._where.pop(request_id, None)
        if place is None:
            return False
        band, account = place
        queue = self._bands[band]
        mine = queue.waiting[account]
        mine.remove(request_id)
        if not mine:
            del queue.waiting[account]
            queue.ring.remove(account)
            if not queue.ring:
                del self._bands[band]
        left = self._per_account[account] - 1
        if left:
            self._per_account[account] = left
        else:
            del self._per_account[account]
        return True

    def victim(self, below: int | None = None) -> str | None:
        """The request to shed when the queue must shrink: the newest of the heaviest account
        in the least urgent band. With ``below``, only from a band less urgent than it (an
        arrival never displaces its equals); None when there is nothing to shed."""
        if not self._bands:
            return None
        band = max(self._bands)
        if below is not None and band <= below:
            return None
        queue = self._bands[band]
        heaviest = max(reversed(queue.ring), key=lambda account: len(queue.waiting[account]))
        return queue.waiting[heaviest][-1]

    def newest_of(self, account: str) -> str | None:
        """``account``'s newest request in its least urgent band (shed first when it holds
        more than its share)."""
        for band in sorted(self._bands, reverse=True):
            mine = self._bands[band].waiting.get(account)
            if mine:
                return mine[-1]
        return None
