"""What a control call on a runner's model did: :class:`UnloadOutcome` of an unload and
:class:`FlushOutcome` of a cache flush, as :class:`runners.service.RunnerService` returns them
for the control API to report.
"""

from __future__ import annotations

from dataclasses import dataclass

from runners.cache import Flushed
from runners.lifecycle import Unloaded
from runners.model import ModelCacheFlush


@dataclass(frozen=True)
class UnloadOutcome:
    unloaded: Unloaded
    cache: Flushed
    """The model's entries dropped from the result cache with it."""

    @property
    def freed_bytes(self) -> int:
        """The model's own figure plus the result-cache entries dropped."""
        return self.unloaded.model_bytes + self.cache.bytes_freed


@dataclass(frozen=True)
class FlushOutcome:
    cache: Flushed
    model: ModelCacheFlush | None
    """What the model's own caches released; None when they were not flushed (or it has none)."""
