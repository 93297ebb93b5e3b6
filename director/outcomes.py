"""What a run's success may still be refused for: a hook between the runner's succeeded
snapshot and the terminal write (a training's: its weights kept, its new version made)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class OutputRefused(Exception):
    """A run that succeeded but whose output cannot be taken as it is (its error): it fails."""


#: Turns a successful run's output into what is recorded (a training's: its new version).
SuccessHook = Callable[[Any], Awaitable[Any]]
