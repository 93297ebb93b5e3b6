"""``pool.yaml`` (or ``pool.toml``): the pool host's configuration file, read into the core's
:class:`PoolConfig` and one backend description per model.

::

    budget: 24GiB          # per device; omitted: the probe's total less ``reserve`` (10 %)
    keep_alive: 300        # seconds after a model's last request (0: at once, -1: never)
    min_resident: 30       # seconds a model stays before it may be evicted
    models:
      - name: small
        backend: {conduit: echo}                 # echo | embeddings | vllm | module:Class
        size: 2GiB                               # declared; the lease is max(this, observed)
        concurrency: 4
      - name: cogged
        backend:
          cog: {command: [python, -m, cog.server.http], cwd: ./model, env: {}}
        size: 1GiB
        pinned: true

Errors are :class:`PoolFileError` naming the field (``models.1.size: ...``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from runners.pool.config import ModelSpec, Policy, PoolConfig, QueueMode

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


class PoolFileError(ValueError):
    """The file cannot be read or a field is wrong; the message names the field."""


def parse_size(value: object) -> int:
    """Bytes from ``123``, ``"512MiB"``, ``"24GiB"`` or ``"1.5GB"``."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string such as 24GiB")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        unit = _UNITS.get(match[2].lower())
        if unit is None:
            raise ValueError(f"unknown unit {match[2]!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB)")
        size = int(float(match[1]) * unit)
    else:
        raise ValueError("a size is a number of bytes or a string such as 24GiB")
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


Size = Annotated[int, BeforeValidator(parse_size)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CogCommand(_Strict):
    """A stock Cog server started as a subprocess; ``{port}`` in an argument is its port (also
    in ``PORT``). Default: ``python -m cog.server.http --host 127.0.0.1`` with this Python."""

    command: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    #: A trained version's weights (its training's ``output.weights``): the server gets them
    #: as Cog expects, in ``COG_WEIGHTS``, which its ``setup(weights)`` receives.
    weights: str | None = None

    def environment(self) -> dict[str, str]:
        """``env``, with ``COG_WEIGHTS`` when ``weights`` is given."""
        return {**self.env, "COG_WEIGHTS": self.weights} if self.weights else dict(self.env)


class BackendFile(_Strict):
    """Exactly one of ``conduit`` (a Conduit model by name or ``module:Class``, with
    ``args`` for its constructor) and ``cog``."""

    conduit: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    cog: CogCommand | None = None

    @pydantic.model_validator(mode="after")
    def _one_kind(self) -> BackendFile:
        if (self.conduit is None) == (self.cog is None):
            raise ValueError("give exactly one of conduit (a model) and cog (a command)")
        if self.cog is not None and self.args:
            raise ValueError("args are for a conduit model; a cog server takes env")
        return self


class ModelFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    backend: BackendFile
    size: Size
    concurrency: Annotated[int, Field(ge=1)] = 1
    keep_alive: float | None = None
    pinned: bool = False
    priority: int = 0
    load_timeout: Annotated[float, Field(gt=0)] = 300.0
    tensor_parallel: Annotated[int, Field(ge=1)] = 1
    load_seconds: Annotated[float, Field(ge=0)] = 0.0


class PoolFile(_Strict):
    budget: Size | None = None
    reserve: Annotated[float, Field(ge=0, lt=1)] = 0.10
    keep_alive: float = 300.0
    keep_alive_cap: Annotated[float, Field(ge=0)] = 3600.0
    min_resident: Annotated[float, Field(ge=0)] = 30.0
    max_queue_depth: Annotated[int, Field(ge=0)] = 64
    starvation_after: Annotated[float, Field(gt=0)] = 30.0
    cooldown_initial: Annotated[float, Field(gt=0)] = 10.0
    cooldown_max: Annotated[float, Field(gt=0)] = 300.0
    policy: Policy = Policy.LRU
    queue: QueueMode = QueueMode.WARM
    device: Literal["cpu", "gpu", "auto"] = "auto"
    """Where the budget is measured when none is given: NVML's GPUs, system memory, or the
    GPUs when NVML finds any (``auto``)."""
    models: Annotated[list[ModelFile], Field(min_length=1)]

    @pydantic.model_validator(mode="after")
    def _unique(self) -> PoolFile:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        return self

    def pool_config(self) -> PoolConfig:
        return PoolConfig(
            models=[
                ModelSpec(
                    name=m.name,
                    declared_bytes=m.size,
                    concurrency=m.concurrency,
                    keep_alive=m.keep_alive,
                    pinned=m.pinned,
                    priority=m.priority,
                    tensor_parallel=m.tensor_parallel,
                    load_timeout=m.load_timeout,
                    load_seconds=m.load_seconds,
                )
                for m in self.models
            ],
            budget_bytes=self.budget,
            reserve_fraction=self.reserve,
            keep_alive=self.keep_alive,
            keep_alive_cap=self.keep_alive_cap,
            min_resident=self.min_resident,
            max_queue_depth=self.max_queue_depth,
            starvation_after=self.starvation_after,
            cooldown_initial=self.cooldown_initial,
            cooldown_max=self.cooldown_max,
            policy=self.policy,
            queue_mode=self.queue,
        )


def parse(data: object) -> PoolFile:
    try:
        return PoolFile.model_validate(data)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "pool"
        raise PoolFileError(f"{where}: {first['msg']}") from None


def load(path: str | Path) -> PoolFile:
    """Read and check ``path``: TOML when it ends in ``.toml``, else YAML (JSON is YAML too)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise PoolFileError(f"{path}: {error.strerror}") from None
    if path.suffix == ".toml":
        try:
            return parse(tomllib.loads(text))
        except tomllib.TOMLDecodeError as error:
            raise PoolFileError(f"{path}: not TOML: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PoolFileError(f"{path}: not YAML: {error}") from None
    return parse(data)
