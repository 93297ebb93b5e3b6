"""``vllm``: an LLM served by vLLM, streaming its completion as it is generated.

:class:`VLLMModel` speaks only :class:`~runners.models.llm_engine.Engine`; :class:`VLLMEngine`
adapts vLLM's ``AsyncLLM`` (the V1 engine, prefix caching on) to it. vLLM is imported inside
:meth:`VLLMEngine.start`, so this module imports, and its schema is served, on machines
without it (``pip install .[vllm]`` on a GPU host).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import gc
import inspect
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from runners.control_errors import CacheBusyError
from runners.model import Model, ModelCacheFlush, PredictContext
from runners.models.llm_engine import Engine, Generated, KVCacheUsage, Sampling
from runners.schema import InputField, build_openapi_schema, iterator_output

log = logging.getLogger(__name__)

MODEL_ENV = "CONDUIT_VLLM_MODEL"

_MESSAGES: dict[str, Any] = {
    "title": "Messages",
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
        "required": ["role", "content"],
    },
    "minItems": 1,
    "default": None,
    "nullable": True,
    "description": "Chat messages ({role, content}), rendered with the model's chat template; "
    "instead of prompt",
}

# vLLM renamed the gauge; read whichever this release registers.
_KV_USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


class VLLMModel(Model):
    """Completes ``prompt``, or the chat ``messages``, yielding each new piece of text.

    The engine is built once, from ``engine_factory(model, **engine_options)`` (default
    :class:`VLLMEngine`); :meth:`setup` starts it and :meth:`unload` shuts it down, as often as
    the runner loads and unloads the model. The prediction id is the engine's request id.
    """

    name: ClassVar[str] = "vllm"
    inputs: ClassVar[tuple[InputField, ...]] = (
        InputField("prompt", "string", default=None, nullable=True, description="Text to complete"),
        InputField(
            "max_tokens", "integer", default=256, ge=1, description="Most tokens to generate"
        ),
        InputField(
            "temperature",
            "number",
            default=0.7,
            ge=0,
            description="Sampling temperature; 0 is greedy",
        ),
    )
    output: ClassVar[dict[str, Any]] = iterator_output({"type": "string"}, concatenate=True)
    prefix_caching: ClassVar[bool] = True

    def __init__(
        self,
        model: str | None = None,
        engine_factory: Callable[..., Engine] | None = None,
        **engine_options: Any,
    ) -> None:
        model_id = model or os.environ.get(MODEL_ENV)
        if not model_id:
            raise ValueError(f"the vllm model needs weights: pass --model or set {MODEL_ENV}")
        self.model_id = model_id
        self.engine: Engine = (engine_factory or VLLMEngine)(model_id, **engine_options)
        self.device = self.engine.device
        self.quantization = engine_options.get("quantization")
        self._loaded = False

    def openapi_schema(self) -> dict[str, Any]:
        # InputField has no array type: add ``messages`` after ``prompt`` and require one of them.
        document = build_openapi_schema(self.inputs, self.output)
        schema = document["components"]["schemas"]["Input"]
        fields = dict(schema["properties"])
        messages = {"x-order": 0, **copy.deepcopy(_MESSAGES)}
        properties = {"prompt": fields.pop("prompt"), "messages": messages, **fields}
        for order, prop in enumerate(properties.values()):
            prop["x-order"] = order
        schema["properties"] = properties
        schema["anyOf"] = [{"required": ["prompt"]}, {"required": ["messages"]}]
        return document

    async def setup(self) -> None:
        if self._loaded:
            return
        log.info("loading %s on %s", self.model_id, self.device)
        began = time.monotonic()
        try:
            await self.engine.start()
        except BaseException:
            await self.engine.shutdown()  # a half-started engine may already hold the device
            raise
        self._loaded = True
        kv = self.engine.kv_cache()
        log.info(
            "loaded %s in %.1fs: max_model_len=%d, kv blocks=%s, %d MiB",
            self.model_id,
            time.monotonic() - began,
            self.engine.max_model_len,
            kv.blocks_total,
            self.engine.memory_bytes() // 2**20,
        )

    async def unload(self) -> None:
        if not self._loaded:
            return
        self._loaded = False  # refuse new predictions before the engine goes away
        await self.engine.shutdown()
        log.info("unloaded %s", self.model_id)

    def memory_bytes(self) -> int:
        return self.engine.memory_bytes() if self._loaded else 0

    def load_progress(self) -> float:
        return 1.0 if self._loaded else 0.0

    async def flush_cache(self) -> ModelCacheFlush | None:
        """Reset the prefix cache; the blocks freed are the engine's count of prefix blocks
        before and after, when it keeps one. Bytes are not reported: the blocks go back to the
        engine's preallocated pool, not to the device."""
        if not self._loaded:
            return None
        before = self.engine.kv_cache().blocks_cached
        await self.engine.reset_prefix_cache()
        after = self.engine.kv_cache().blocks_cached
        freed = None if before is None or after is None else max(0, before - after)
        return ModelCacheFlush(bytes_freed=None, blocks_freed=freed)

    def context_length(self) -> int | None:
        return self.engine.max_model_len if self._loaded else None

    def kv_cache(self) -> tuple[int | None, float | None]:
        if not self._loaded:
            return 0, 0.0
        # The engine counts blocks, not bytes: the pool's size is not measured here.
        return None, self.engine.kv_cache().usage

    def extra_capabilities(self) -> dict[str, Any]:
        if not self._loaded:
            return {"model": self.model_id, "max_model_len": None, "kv_cache": None}
        return {
            "model": self.model_id,
            "max_model_len": self.engine.max_model_len,
            "kv_cache": dataclasses.asdict(self.engine.kv_cache()),
        }

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> AsyncIterator[str]:
        if not self._loaded:
            raise RuntimeError(f"model {self.model_id} is not loaded")
        engine = self.engine
        prompt, add_special_tokens = self._prompt(inputs)
        sampling = Sampling(max_tokens=inputs["max_tokens"], temperature=inputs["temperature"])
        request_id = ctx.prediction_id
        last: Generated | None = None
        sent = 0
        try:
            stream = engine.generate(
                prompt, sampling, request_id, add_special_tokens=add_special_tokens
            )
            async with contextlib.aclosing(stream):
                async for last in stream:
                    if len(last.text) > sent:
                        delta, sent = last.text[sent:], len(last.text)
                        yield delta
        finally:
            if last is None or not last.finished:
                # Canceled (CancelledError at an await, GeneratorExit at a yield) or failed:
                # without an abort the engine keeps decoding for nobody. Shielded so that a
                # second cancel cannot interrupt the abort itself.
                await asyncio.shield(engine.abort(request_id))
        cached = last.num_cached_tokens if last is not None else 0
        ctx.model_cache_lookup(hit=cached > 0, tokens_reused=cached)
        if cached:
            ctx.log(f"prefix cache: reused {cached} prompt tokens")

    def _prompt(self, inputs: Mapping[str, Any]) -> tuple[str, bool]:
        """The text to generate from, and whether the engine should add special tokens."""
        prompt: str | None = inputs.get("prompt")
        messages: list[dict[str, str]] | None = inputs.get("messages")
        if prompt is not None and messages is not None:
            raise ValueError("give either prompt or messages, not both")
        if messages is not None:
            return self.engine.chat_prompt(messages), False
        if prompt is None:
            raise ValueError("give a prompt or messages")
        return prompt, True


class VLLMEngine:
    """vLLM's ``AsyncLLM`` as an :class:`Engine`; ``options`` go to ``AsyncEngineArgs``.

    The engine core runs in a child process, so this process's torch allocator sees none of
    its memory: :meth:`memory_bytes` is how much the device's used memory has grown since just
    before the engine started, which assumes the runner has its GPU to itself (as runners are
    deployed). Select the GPU with ``CUDA_VISIBLE_DEVICES``, as vLLM expects.
    """

    device = "cuda:0"

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.max_model_len = 0
        self._options = {"enable_prefix_caching": True, **options}
        self._llm: Any = None
        self._tokenizer: Any = None
        self._baseline = 0

    async def start(self) -> None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as error:
            raise RuntimeError(
                "vLLM is not installed: pip install '.[vllm]' on a GPU host"
            ) from error

        args = AsyncEngineArgs(model=self.model, **self._options)
        self._baseline = _device_memory_used(0)
        # Loading weights, profiling memory and capturing CUDA graphs blocks for minutes: do it
        # off the event loop so /health-check keeps answering. AsyncLLM starts its output
        # handler lazily, in the loop of its first request.
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        tokenizer = self._llm.get_tokenizer()
        # Earlier V1 releases make get_tokenizer() a coroutine.
        self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        self.max_model_len = int(self._llm.model_config.max_model_len)

    async def generate(
        self, prompt: str, sampling: Sampling, request_id: str, *, add_special_tokens: bool = True
    ) -> AsyncGenerator[Generated, None]:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature)
        source: Any = prompt
        if not add_special_tokens:
            # Token ids, so vLLM does not put a second BOS before the template's own.
            ids = self._tokenizer.encode(prompt, add_special_tokens=False)
            source = {"prompt_token_ids": ids}
        async with contextlib.aclosing(self._llm.generate(source, params, request_id)) as outputs:
            async for output in outputs:
                text = output.outputs[0].text
                yield Generated(text, output.num_cached_tokens or 0, bool(output.finished))

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> str:
        rendered = self._tokenizer.apply_chat_template(
            [dict(message) for message in messages], tokenize=False, add_generation_prompt=True
        )
        return str(rendered)

    async def reset_prefix_cache(self) -> None:
        # Recent releases answer False, and keep the cache, while requests are running; older
        # ones answer None whatever happened, which is all that can be known then.
        if await self._llm.reset_prefix_cache() is False:
            raise CacheBusyError(
                f"vLLM kept the prefix cache of {self.model}: requests are running; "
                "retry when they have finished"
            )

    async def shutdown(self) -> None:
        llm, self._llm, self._tokenizer = self._llm, None, None
        self.max_model_len = 0
        if llm is None:
            return
        await asyncio.to_thread(llm.shutdown)  # joins the engine core process
        del llm
        gc.collect()
        import torch

        torch.cuda.empty_cache()  # a no-op unless this process itself touched CUDA

    def memory_bytes(self) -> int:
        if self._llm is None:
            return 0
        return max(0, _device_memory_used(0) - self._baseline)

    def kv_cache(self) -> KVCacheUsage:
        """From vLLM's usage gauge (None until its stat logger has reported one) and the
        configured block count. vLLM reports no count of cached prefix blocks: the engine core
        keeps them in another process."""
        usage = _gauge(_KV_USAGE_GAUGES)
        total = None
        if self._llm is not None:
            total = getattr(self._llm.vllm_config.cache_config, "num_gpu_blocks", None)
        used = None if usage is None or total is None else round(usage * total)
        return KVCacheUsage(usage, total, used)


def _device_memory_used(index: int) -> int:
    import torch

    try:
        # NVML first: it creates no CUDA context here, so vLLM can still fork its workers.
        return int(torch.cuda.device_memory_used(index))
    except Exception:  # pynvml missing or NVML unusable: ask the CUDA runtime instead
        free, total = torch.cuda.mem_get_info(index)
        return int(total - free)


def _gauge(names: Collection[str]) -> float | None:
    """The largest sample of whichever of ``names`` vLLM registered with prometheus."""
    from prometheus_client import REGISTRY

    for metric in REGISTRY.collect():
        if metric.name in names:
            values = [sample.value for sample in metric.samples if sample.name == metric.name]
            if values:
                return max(values)
    return None
