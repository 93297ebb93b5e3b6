"""Calls the gateway with NVIDIA's ``tritonclient`` as a Triton user would, and prints what it
got as one JSON object. Run with the ``tritonclient`` environment's Python (``.venv-triton``):

    triton_client.py ADDRESS TOKEN MODEL

``tests/gateway/test_oip_triton.py`` runs it and checks what it printed. Every tensor is sent
the way ``tritonclient`` sends it: raw contents."""

from __future__ import annotations

import json
import queue
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

#: The messages of the protocol the gateway serves, as tritonclient's stubs define them.
MESSAGES = (
    "ServerLiveRequest",
    "ServerLiveResponse",
    "ServerReadyRequest",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataRequest",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "InferParameter",
    "InferTensorContents",
    "ModelInferRequest",
    "ModelInferResponse",
    "ModelStreamInferResponse",
)


def describe() -> dict[str, Any]:
    """Each message's fields (nested ones as ``Outer.Inner``): name -> [number, type, repeated]."""
    found: dict[str, Any] = {}

    def walk(message: Any, name: str) -> None:
        found[name] = {f.name: [f.number, f.type, f.is_repeated] for f in message.fields}
        for nested in message.nested_types:
            if not nested.GetOptions().map_entry:
                walk(nested, f"{name}.{nested.name}")

    for name in MESSAGES:
        walk(service_pb2.DESCRIPTOR.message_types_by_name[name], name)
    return found


def decoded(result: Any, name: str) -> Any:
    """An output read back with ``as_numpy``, as JSON (BYTES as text)."""
    array = result.as_numpy(name)
    if array.dtype == np.object_:
        return [[e.decode() for e in row] if array.ndim > 1 else row.decode() for row in array]
    return array.tolist()


def main() -> None:
    address, token, model = sys.argv[1:4]
    headers = {"authorization": f"Bearer {token}"}
    client = grpcclient.InferenceServerClient(address)
    got: dict[str, Any] = {"descriptor": describe()}

    got["live"] = client.is_server_live(headers=headers)
    got["ready"] = client.is_server_ready(headers=headers)
    got["server"] = client.get_server_metadata(headers=headers, as_json=True)
    got["model_ready"] = client.is_model_ready(model, headers=headers)
    got["model"] = client.get_model_metadata(model, headers=headers, as_json=True)

    ids = grpcclient.InferInput("ids", [3], "INT64")
    ids.set_data_from_numpy(np.array([1, -2, 2**40], dtype=np.int64))
    scale = grpcclient.InferInput("scale", [1], "FP32")
    scale.set_data_from_numpy(np.array([0.5], dtype=np.float32))
    grid = grpcclient.InferInput("grid", [2, 2], "FP32")
    grid.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
    prompt = grpcclient.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array(["héllo".encode()], dtype=np.object_))
    words = grpcclient.InferInput("words", [2], "BYTES")
    words.set_data_from_numpy(np.array([b"a", b"b"], dtype=np.object_))
    result = client.infer(
        model, [ids, scale, grid, prompt, words], request_id="r-1", headers=headers
    )
    response = result.get_response(as_json=True)
    data = result.get_output("data")
    got["infer"] = {
        "id": response.get("id"),
        "model_name": response.get("model_name"),
        "data": json.loads(decoded(result, "data")[0]),
        "data_content_type": data.parameters["content_type"].string_param,
        "block_id": decoded(result, "block_id"),
        "seq_no": decoded(result, "seq_no"),
        "has_deadline": decoded(result, "has_deadline"),
        "ts_dtype": str(result.as_numpy("ts").dtype),
        "seq_no_dtype": str(result.as_numpy("seq_no").dtype),
    }

    try:
        client.infer(model, [ids], headers={"authorization": "Bearer r8_" + "A" * 40})
    except InferenceServerException as error:
        got["wrong_token"] = {"status": error.status(), "message": error.message()}

    try:
        client.infer(model, [ids, ids], headers=headers)
    except InferenceServerException as error:
        got["bad_tensor"] = {"status": error.status(), "message": error.message()}

    got["stream"] = stream(client, model, headers)
    client.close()
    print(json.dumps(got))


def stream(client: Any, model: str, headers: dict[str, str]) -> list[Any]:
    """Three requests of sequence 7 on one stream: the first streams three items; the other two
    echo the task (its session and seq_no)."""
    answers: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        answers.put((result, error))

    items = grpcclient.InferInput("items", [1], "BYTES")
    items.set_data_from_numpy(np.array([b'["tok1", "tok2", "tok3"]'], dtype=np.object_))
    number = grpcclient.InferInput("x", [1], "INT64")
    number.set_data_from_numpy(np.array([5], dtype=np.int64))
    client.start_stream(callback=callback, headers=headers)
    client.async_stream_infer(
        model,
        [items],
        request_id="s-1",
        sequence_id=7,
        sequence_start=True,
        enable_empty_final_response=True,
        parameters={"content_type": "json"},
    )
    client.async_stream_infer(model, [number], request_id="s-2", sequence_id=7)
    client.async_stream_infer(model, [number], request_id="s-3", sequence_id=7, sequence_end=True)
    client.stop_stream()  # waits for every response

    seen = []
    while not answers.empty():
        result, error = answers.get()
        if error is not None:
            seen.append({"error": str(error)})
            continue
        response = result.get_response()
        entry: dict[str, Any] = {"id": response.id}
        names = [output.name for output in response.outputs]
        if "output" in names:
            entry["output"] = decoded(result, "output")
        if "session_id" in names:
            entry["session_id"] = decoded(result, "session_id")
            entry["seq_no"] = decoded(result, "seq_no")
        if "triton_final_response" in response.parameters:
            entry["final"] = response.parameters["triton_final_response"].bool_param
        seen.append(entry)
    return seen


if __name__ == "__main__":
    main()
