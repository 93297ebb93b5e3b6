"""What the ``vllm`` model needs from an LLM engine, and nothing more.

:class:`Engine` is the seam between :class:`runners.models.vllm.VLLMModel` and vLLM: the real
engine is wrapped by :class:`runners.models.vllm.VLLMEngine`, and tests plug in a small CPU
engine with the same shape, so the model's code is the same on a GPU and in CI. It holds no
vLLM types: the model module imports on machines without vLLM installed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int
    temperature: float


@dataclass(frozen=True, slots=True)
class Generated:
    """One step of a generation. ``text`` is cumulative (everything generated so far);
    ``num_cached_tokens`` is how many prompt tokens came from the prefix cache."""

    text: str
    num_cached_tokens: int
    finished: bool


@dataclass(frozen=True, slots=True)
class KVCacheUsage:
    """The KV cache as the engine reports it; every figure is None when it does not.

    ``usage`` is the fraction (0-1) of blocks held by running requests and ``blocks_used``
    their count (as vLLM counts: blocks that only hold a reusable prefix are free, since they
    can be evicted at any time). ``blocks_cached`` counts those prefix blocks.
    """

    usage: float | None
    blocks_total: int | None = None
    blocks_used: int | None = None
    blocks_cached: int | None = None


class Engine(Protocol):
    """An LLM engine that can be started, stream generations, abort them and shut down."""

    @property
    def device(self) -> str:
        """Where the engine runs: "cpu" or a CUDA device such as "cuda:0"."""
        ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus completion, in tokens; known once started."""
        ...

    async def start(self) -> None:
        """Load the weights and allocate the KV cache; the slow part of setup."""

    def generate(
        self, prompt: str, sampling: Sampling, request_id: str, *, add_special_tokens: bool = True
    ) -> AsyncGenerator[Generated, None]:
        """Stream one completion. ``add_special_tokens=False`` is for prompts rendered by
        :meth:`chat_prompt`, whose template already carries BOS and the like."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop the named generation and free its KV blocks; a no-op once it has ended."""

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> str:
        """``messages`` ({role, content} objects) rendered with the model's chat template,
        ending where the assistant's reply begins."""
        ...

    async def reset_prefix_cache(self) -> None:
        """Drop cached prefixes. Raises :class:`runners.control_errors.CacheBusyError`, keeping
        them, when the engine refuses (requests are running)."""

    async def shutdown(self) -> None:
        """Stop the engine and release its device memory."""

    def memory_bytes(self) -> int:
        """Device memory the engine holds (weights, KV cache, activations)."""
        ...

    def kv_cache(self) -> KVCacheUsage: ...
