"""Each account's, and each prediction's, share of a process's waiters (``Prefer: wait`` and
SSE clients, ``tracker.event_hub``).

Without shares, one account could hold every waiter place of a replica, and every other
account's SSE would be refused and its ``Prefer: wait`` answered at once. A stream URL is a
capability, so one leaked link is enough for anyone to do it in that account's name: a
prediction therefore has a share of its own, inside its account's, and a flood through one
link costs the account only that prediction's share.

The shares are the ``/run`` lane's rule (:func:`account_cap`, which the lane's queues apply
too): an account may hold half the process's places (rounded up), a prediction half its
account's, unless configured.
Counts are per process, like the cap they divide.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def account_cap(places: int) -> int:
    """How many of ``places`` one account may hold: half, rounded up (so a single place is
    still usable), 0 when there are none. The lane's queues and the waiter shares both use it."""
    return (places + 1) // 2


class WaiterShares:
    """Counts waiters per account and per prediction; ``admit`` refuses one past either share.
    ``None`` for a share: no limit of that kind."""

    def __init__(self, per_account: int | None = None, per_prediction: int | None = None) -> None:
        self.per_account = per_account
        self.per_prediction = per_prediction
        self._accounts: Counter[Hashable] = Counter()
        self._predictions: Counter[str] = Counter()

    @classmethod
    def of(
        cls, max_waiters: int, per_account: int | None = None, per_prediction: int | None = None
    ) -> WaiterShares:
        """The shares of a process holding ``max_waiters``: those given, else the lane's rule."""
        account = account_cap(max_waiters) if per_account is None else per_account
        prediction = account_cap(account) if per_prediction is None else per_prediction
        return cls(account, prediction)

    def admit(self, account: Hashable | None, prediction_id: str) -> bool:
        """Count one more waiter, unless its account or its prediction holds its share. A
        waiter of no known account (``None``) counts for its prediction only."""
        if self.per_prediction is not None and (
            self._predictions[prediction_id] >= self.per_prediction
        ):
            return False
        if account is not None and self.per_account is not None:
            if self._accounts[account] >= self.per_account:
                return False
        self._predictions[prediction_id] += 1
        if account is not None:
            self._accounts[account] += 1
        return True

    def release(self, account: Hashable | None, prediction_id: str) -> None:
        """Uncount a waiter ``admit`` counted."""
        _decrement(self._predictions, prediction_id)
        if account is not None:
            _decrement(self._accounts, account)

    def held(self, account: Hashable) -> int:
        """Waiters ``account`` holds now."""
        return self._accounts[account]


def _decrement(counts: Counter[K], key: K) -> None:
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]
