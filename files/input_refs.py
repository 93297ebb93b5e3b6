"""File references in a prediction's input: URLs whose path is ``/v1/files/{id}``, found
anywhere in the document and replaced by delivery URLs (``Files.input_links``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from files.links import file_reference


@dataclass(frozen=True, slots=True)
class FileRefError:
    """A file reference in an input that names no usable file: where, and why."""

    field: str
    message: str


def references(
    value: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path, file id) of every file reference in ``value``, in document order."""
    if isinstance(value, str):
        file_id = file_reference(value)
        if file_id is not None:
            yield path, file_id
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from references(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from references(item, (*path, index))


def replace_references(value: Any, urls: dict[str, str | None]) -> Any:
    if isinstance(value, str):
        file_id = file_reference(value)
        url = urls.get(file_id) if file_id is not None else None
        return url if url is not None else value
    if isinstance(value, dict):
        return {key: replace_references(item, urls) for key, item in value.items()}
    if isinstance(value, list):
        return [replace_references(item, urls) for item in value]
    return value
