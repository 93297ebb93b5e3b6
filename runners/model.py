"""What a model must provide to be served: a name, its schema, ``setup`` and ``predict``.

``predict`` is either an async generator (each ``yield`` is one output; the prediction's
output is the list of them, streamed as it grows) or a coroutine returning one value.
Raising from ``predict`` fails the prediction (status ``failed``, ``error`` = the message);
cancellation arrives as :class:`asyncio.CancelledError` at the model's next ``await``.
``predict`` runs on the server's event loop, so blocking work belongs in a thread
(``asyncio.to_thread``) or another process. Outputs must be JSON-serialisable, or be (or hold)
:class:`pathlib.Path` files, which leave as URLs (:mod:`runners.file_outputs`); file inputs
arrive as :class:`pathlib.Path` (:mod:`runners.file_inputs`).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from runners.cache import CacheView
from runners.schema import InputField, build_openapi_schema

PredictResult = AsyncIterator[Any] | Awaitable[Any]


@dataclass(frozen=True, slots=True)
class ModelCacheFlush:
    """What dropping a model's own caches released; ``None`` where the model cannot measure it
    (a figure is never guessed)."""

    bytes_freed: int | None = None
    blocks_freed: int | None = None
    """KV-cache blocks (LLMs): returned to the engine's pool, not necessarily to the device."""


class PredictContext:
    """Handed to ``predict``: the prediction's id, its request context, and a log sink.

    ``tenant`` and ``cache`` come from the request's ``X-Tenant-ID`` and ``X-Cache-Mode`` /
    ``X-Cache-Tag`` headers. A model that serves part of a request from a cache says so with
    :meth:`cache_used`; the runner reports it in ``X-Cache-Hit`` / ``X-Cache-Tokens-Reused``.
    A model with a cache of its own (an LLM's prefix cache) reports each lookup, hit or miss,
    with :meth:`model_cache_lookup`, which also counts towards the runner's cache hit ratio.
    """

    def __init__(
        self,
        prediction_id: str,
        context: Mapping[str, str],
        sink: Callable[[str], None],
        *,
        tenant: str = "default",
        cache: CacheView | None = None,
    ) -> None:
        self.prediction_id = prediction_id
        self.context = dict(context)
        self.tenant = tenant
        self.cache = cache
        self.cache_hit = False
        self.tokens_reused = 0
        self.model_cache_hits = 0
        self.model_cache_misses = 0
        self._sink = sink
        self._scratch: Path | None = None

    def scratch_dir(self) -> Path:
        """A directory of this prediction's own, for its files (downloaded inputs, outputs
        being made); removed with everything in it once the prediction has ended and its
        outputs have been handed over."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="conduit-prediction-"))
        return self._scratch

    async def discard_scratch(self) -> None:
        if self._scratch is not None:
            path, self._scratch = self._scratch, None
            await asyncio.to_thread(shutil.rmtree, path, ignore_errors=True)

    def cache_used(self, hit: bool, tokens_reused: int = 0) -> None:
        """Record that (part of) this prediction was served from a cache."""
        self.cache_hit = self.cache_hit or hit
        self.tokens_reused += tokens_reused

    def model_cache_lookup(self, hit: bool, tokens_reused: int = 0) -> None:
        """Record one lookup in the model's own cache (the result cache counts its own)."""
        if hit:
            self.model_cache_hits += 1
        else:
            self.model_cache_misses += 1
        self.cache_used(hit, tokens_reused)

    def log(self, line: str) -> None:
        """Append one line to the prediction's logs (a trailing newline is added if missing)."""
        self._sink(line if line.endswith("\n") else line + "\n")


class Model:
    """Base class for served models.

    Subclasses set ``name``, ``inputs`` and ``output`` (the ``Output`` JSON schema; see
    :func:`runners.schema.iterator_output`) and implement :meth:`predict`. A model with an
    unusual schema can override :meth:`openapi_schema` instead of declaring ``inputs``.
    """

    name: ClassVar[str]
    inputs: ClassVar[Sequence[InputField]] = ()
    output: ClassVar[Mapping[str, Any]] = {}
    #: Where predictions run: "cpu", or a CUDA device such as "cuda:0". Time on a "cuda"
    #: device is reported as GPU time (``X-GPU-Time-Ms``, ``metrics.gpu_time``).
    device: str = "cpu"
    #: Weight quantization as the runner API spec names it (awq-4bit, fp16, ...); None if the
    #: model does not say.
    quantization: str | None = None
    #: Whether repeated prompt prefixes are served from a cache of the model's own.
    prefix_caching: ClassVar[bool] = False

    def openapi_schema(self) -> dict[str, Any]:
        return build_openapi_schema(self.inputs, self.output)

    async def setup(self) -> None:
        """Load weights and the like; runs before the runner reports READY, and again each time
        the control API loads the model after an unload."""

    async def unload(self) -> None:
        """Release what :meth:`setup` acquired (weights, device memory); the runner refuses
        predictions until the model is loaded again."""

    def memory_bytes(self) -> int:
        """Bytes the loaded model holds (weights and buffers on its device); 0 if unknown."""
        return 0

    def load_progress(self) -> float:
        """How far a running :meth:`setup` is, 0.0-1.0; models that cannot tell keep 0.0."""
        return 0.0

    def load_stage(self) -> str | None:
        """The step a running :meth:`setup` is on (e.g. "reading weights"); None if unknown."""
        return None

    async def flush_cache(self) -> ModelCacheFlush | None:
        """Drop the model's own caches (e.g. an LLM's prefix cache) and say what that released;
        None for a model without caches of its own. Raises
        :class:`runners.control_errors.CacheBusyError` when the caches cannot be dropped now."""
        return None

    def context_length(self) -> int | None:
        """Longest sequence the loaded model takes, in tokens; None where that means nothing."""
        return None

    def kv_cache(self) -> tuple[int | None, float | None]:
        """(bytes, utilisation 0-1) of the loaded model's KV cache; (0, 0.0) for a model
        without one, None for a figure it cannot measure."""
        return 0, 0.0

    def extra_capabilities(self) -> dict[str, Any]:
        """Model-specific figures for ``GET /v1/capabilities`` (e.g. KV-cache usage)."""
        return {}

    def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> PredictResult:
        raise NotImplementedError
