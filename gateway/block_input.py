"""A task's Cog input: its ``data``, its ``frame_ptr`` and its ``files``.

- ``data`` is the input object itself.
- ``frame_ptr``, when set, is passed on unchanged as the ``frame_ptr`` input field (its UTF-8
  text; bytes that are not UTF-8 as a ``data:`` URL).
- Each file is stored in the file store as an upload of the account (it expires with the
  uploads' retention) and reaches the model as a file reference (``/v1/files/{id}``), which
  the director turns into a signed URL the runner fetches; its bytes are never logged nor
  kept in the prediction. A file whose metadata names an input field (``"field":
  "image"``) fills that field (several files naming one field make a list); the others make
  the list ``files``. ``file_name`` (or ``name``) and ``content_type`` in the metadata name
  the stored file.

The input is checked against the block's schema with placeholders where the files go, so that
an invalid task stores nothing: :func:`compose` checks, :func:`attach_files` stores.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import AsyncIterator
from typing import Any

from files.names import clean_content_type, clean_name
from files.quota import QuotaExceeded
from files.service import Files
from files.store import StoreUnavailable, TooLarge
from gateway.errors import InvalidArgument, ResourceExhausted, Unavailable
from gateway.task import InputFile, Task

#: The input field a file goes to when its metadata names none.
FILES_FIELD = "files"
FRAME_PTR_FIELD = "frame_ptr"
_PLACEHOLDER = "https://files.invalid/placeholder"
_CHUNK = 1024 * 1024


def file_field(file: InputFile, index: int) -> tuple[str, bool]:
    """The input field ``file`` fills, and whether that field takes a list."""
    named = file.metadata.get("field")
    if named is None:
        return FILES_FIELD, True
    if not isinstance(named, str) or not named:
        raise InvalidArgument("must be a non-empty string", f"files[{index}].metadata.field")
    return named, False


def _placement(task: Task) -> dict[str, list[int]]:
    """Field -> the indexes of the files that fill it, in order."""
    fields: dict[str, list[int]] = {}
    for index, file in enumerate(task.files):
        field, _ = file_field(file, index)
        if field in task.data or field == FRAME_PTR_FIELD:
            raise InvalidArgument(
                f"names input field {field!r}, which data already sets",
                f"files[{index}].metadata.field",
            )
        fields.setdefault(field, []).append(index)
    return fields


def _fill(task: Task, values: list[str]) -> dict[str, Any]:
    composed = dict(task.data)
    for field, indexes in _placement(task).items():
        is_list = field == FILES_FIELD or len(indexes) > 1
        composed[field] = [values[i] for i in indexes] if is_list else values[indexes[0]]
    if task.frame_ptr:
        composed[FRAME_PTR_FIELD] = frame_ptr_text(task.frame_ptr)
    return composed


def compose(task: Task) -> dict[str, Any]:
    """The task's input with a placeholder URL for each file (what is validated)."""
    return _fill(task, [_PLACEHOLDER] * len(task.files))


def frame_ptr_text(frame_ptr: bytes) -> str:
    try:
        return frame_ptr.decode()
    except UnicodeDecodeError:
        return "data:application/octet-stream;base64," + base64.b64encode(frame_ptr).decode()


async def attach_files(files: Files, account_id: int, task: Task) -> dict[str, Any]:
    """Store the task's files; its input, each file as its reference URL."""
    if not task.files:
        return _fill(task, [])
    references = []
    for index, file in enumerate(task.files):
        record = await _store(files, account_id, file, index)
        references.append(files.links.get_url(record.id))
    return _fill(task, references)


async def _store(files: Files, account_id: int, file: InputFile, index: int) -> Any:
    metadata = file.metadata
    name = clean_name(str(metadata.get("file_name") or metadata.get("name") or f"file-{index}"))
    given_type = metadata.get("content_type")
    guessed = mimetypes.guess_type(name)[0]
    content_type = clean_content_type(given_type if isinstance(given_type, str) else guessed)
    try:
        return await files.save_upload(account_id, name, content_type, _chunks(file.data), {})
    except QuotaExceeded as error:  # the account's uploads, whichever door they came through
        raise ResourceExhausted(str(error), f"files[{index}]") from None
    except TooLarge:
        raise ResourceExhausted(
            f"larger than the file store takes ({files.settings.max_bytes} bytes)",
            f"files[{index}]",
        ) from None
    except StoreUnavailable:
        raise Unavailable("the file store is unreachable", f"files[{index}]") from None


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        yield bytes(view[start : start + _CHUNK])
