"""An Open Inference Protocol request as a task, and a task's answer as its response: the
sequence parameters (Triton's ``sequence_id``/``sequence_start``/``sequence_end`` and our
``seq_no``), the task a request is, the tensors an answer is, and the call's time left."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.errors import InvalidArgument
from gateway.executor import OutputFile
from gateway.oip.datatypes import parameter
from gateway.oip.inputs import decode_inputs
from gateway.oip.outputs import Tensor, encode_outputs, output_tensors
from gateway.proto.grpc_service_pb2 import ModelInferRequest, ModelInferResponse
from gateway.task import Task, session_id_of, target_of

Context = grpc.aio.ServicerContext[Any, Any]
#: A ``time_remaining`` past this is a call without a deadline.
_NO_DEADLINE = 10**9


@dataclass(frozen=True, slots=True)
class SequenceParams:
    """A request's place in a Triton sequence (``id`` empty: none)."""

    id: str
    start: bool
    end: bool
    #: The request's own ``seq_no`` parameter, when it gives one.
    seq_no: int | None


def sequence_of(request: ModelInferRequest) -> SequenceParams:
    parameters = request.parameters
    raw_id = parameter(parameters, "sequence_id")
    if raw_id is None or isinstance(raw_id, str):
        sequence_id = raw_id or ""
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        sequence_id = str(raw_id) if raw_id else ""
    else:
        raise InvalidArgument("must be an integer or a string", "parameters.sequence_id")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = parameter(parameters, key)
        if value is not None and not isinstance(value, bool):
            raise InvalidArgument("must be a boolean", f"parameters.{key}")
        flags.append(bool(value))
    seq_no = parameter(parameters, "seq_no")
    if seq_no is not None and (isinstance(seq_no, bool | str | float) or seq_no < 1):
        raise InvalidArgument("must be a positive integer", "parameters.seq_no")
    return SequenceParams(sequence_id, flags[0], flags[1], seq_no)


def task_of(request: ModelInferRequest, session_id: str = "", seq_no: int = 0) -> Task:
    """The request's task (its tensors checked), in session ``session_id`` at ``seq_no``."""
    if not request.model_name:
        raise InvalidArgument("required: the block id of the model", "model_name")
    return Task(
        block_id=target_of(request.model_name, "model_name"),
        session_id=session_id_of(session_id, "parameters.sequence_id"),
        seq_no=seq_no,
        frame_ptr=b"",
        data=decode_inputs(request),
        query_parameters=None,
        ts=time.time(),
    )


def answer_tensors(
    request: ModelInferRequest, value: Any, files: Sequence[OutputFile] = ()
) -> list[Tensor]:
    """The tensors of an answer ``value``, cut to those the request names. The answer's files
    are one more BYTES tensor, ``files`` (``_files`` when the answer has a ``files``), one
    element a file, their metadata a JSON list in its parameter ``file_metadata``."""
    tensors = output_tensors(value)
    if files:
        name = "_files" if any(t.name == "files" for t in tensors) else "files"
        metadata = json.dumps([f.metadata for f in files], separators=(",", ":"))
        tensors.append(
            Tensor(
                name, "BYTES", [len(files)], [f.data for f in files], {"file_metadata": metadata}
            )
        )
    if not request.outputs:
        return tensors
    by_name = {t.name: t for t in tensors}
    chosen = []
    for index, wanted in enumerate(request.outputs):
        found = by_name.get(wanted.name)
        if found is None:
            produced = ", ".join(repr(n) for n in by_name) or "none"
            raise InvalidArgument(
                f"the model gave no output {wanted.name!r} (it gave {produced})",
                f"outputs[{index}]",
            )
        chosen.append(found)
    return chosen


def response_of(request: ModelInferRequest, tensors: list[Tensor]) -> ModelInferResponse:
    """The answer, raw when the request sent raw contents."""
    response = ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return encode_outputs(tensors, response, raw=bool(request.raw_input_contents))


def remaining(context: Context, default: float) -> float:
    """Seconds the task may take: the call's deadline, else ``default``."""
    left = context.time_remaining()
    if left is None or left > _NO_DEADLINE:
        return default
    return float(left)
