"""Logging of every Conduit process: text lines or JSON lines, with the ids of the work at hand.

``CONDUIT_LOG_FORMAT=json`` writes one JSON object per line (``time``, ``level``, ``logger``,
``message``, and ``exception`` when there is one), which log collectors read without a parser
of their own; ``text`` (the default) writes the lines people read in a terminal. Either way,
a line written while a request or a prediction is handled carries its ids (``request_id``,
``prediction_id``): they live in context variables, so each asyncio task has its own and no
call has to pass them along.

Every entry point configures logging here and nowhere else: ``configure_from_env`` reads
``CONDUIT_LOG_LEVEL`` and ``CONDUIT_LOG_FORMAT`` the same way for the CLI, ``python -m runners``
and a runner or pool host started by its ``serve``.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Final

import orjson

FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The request id of the API request, or of the prediction, being handled.
REQUEST_ID: ContextVar[str | None] = ContextVar("conduit_request_id", default=None)
#: The prediction being handled.
PREDICTION_ID: ContextVar[str | None] = ContextVar("conduit_prediction_id", default=None)

#: What a client's ``X-Request-Id`` may be for Conduit to adopt it: short, and nothing a log
#: reader or a header could trip on.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def sane_request_id(value: str | None) -> str | None:
    """``value`` when it may serve as a request id as it is, else None."""
    if value is not None and _SANE_REQUEST_ID.fullmatch(value):
        return value
    return None


def new_request_id() -> str:
    return secrets.token_hex(16)


@contextmanager
def bound(*, request_id: str | None = None, prediction_id: str | None = None) -> Iterator[None]:
    """Log lines written inside carry these ids (those given; the others stay as they were)."""
    tokens = []
    if request_id is not None:
        tokens.append((REQUEST_ID, REQUEST_ID.set(request_id)))
    if prediction_id is not None:
        tokens.append((PREDICTION_ID, PREDICTION_ID.set(prediction_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def _ids() -> dict[str, str]:
    ids = {}
    if (request_id := REQUEST_ID.get()) is not None:
        ids["request_id"] = request_id
    if (prediction_id := PREDICTION_ID.get()) is not None:
        ids["prediction_id"] = prediction_id
    return ids


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_ids(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(document, default=str).decode()


class TextFormatter(logging.Formatter):
    """The classic line, with the ids in brackets after the logger's name when there are any."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        ids = _ids()
        if not ids:
            return line
        head, sep, message = line.partition(": ")
        tags = " ".join(f"{key}={value}" for key, value in ids.items())
        return f"{head} [{tags}]{sep}{message}"


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"CONDUIT_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {log_format!r}")


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Send every logger's records to stderr in ``log_format`` from ``level`` up.

    Replaces whatever handlers the root logger had, so a second call (a test, a subcommand
    that configures again) does not write each line twice. Raises ValueError for an unknown
    format, before anything changes.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format.strip().lower()))
    logging.basicConfig(level=level.strip().upper(), handlers=[handler], force=True)


def configure_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """:func:`configure` from ``CONDUIT_LOG_LEVEL`` (default INFO) and ``CONDUIT_LOG_FORMAT``
    (``text``, the default, or ``json``). Raises ValueError for an unknown format."""
    configure(environ.get("CONDUIT_LOG_LEVEL", "INFO"), environ.get("CONDUIT_LOG_FORMAT", "text"))


def configure_unless_configured(environ: Mapping[str, str] = os.environ) -> None:
    """:func:`configure_from_env`, unless the process configured logging already (its entry
    point did): a server started from a program of its own still logs, and in the same shape."""
    if not logging.getLogger().handlers:
        configure_from_env(environ)
