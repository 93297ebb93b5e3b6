"""``conduit --version``, the log formats and the request-id rule (no servers needed)."""

from __future__ import annotations

import logging
import subprocess
import sys
from importlib.metadata import version

import orjson
import pytest

from api.prefer import MAX_WAIT
from api.settings import ApiSettings
from core.logs import (
    JsonFormatter,
    TextFormatter,
    bound,
    configure,
    new_request_id,
    sane_request_id,
)


def test_version_comes_from_the_installed_package() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conduit", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"conduit {version('conduit')}"


def _record(message: str = "hello %s", *args: object) -> logging.LogRecord:
    return logging.LogRecord("director.x", logging.WARNING, __file__, 1, message, args, None)


def test_json_lines_carry_the_bound_ids_and_only_inside() -> None:
    with bound(request_id="r-1", prediction_id="p1"):
        inside = orjson.loads(JsonFormatter().format(_record("hello %s", "you")))
    assert inside["message"] == "hello you"
    assert inside["level"] == "WARNING" and inside["logger"] == "director.x"
    assert (inside["request_id"], inside["prediction_id"]) == ("r-1", "p1")
    outside = orjson.loads(JsonFormatter().format(_record()))
    assert "request_id" not in outside and "prediction_id" not in outside


def test_json_line_of_an_exception_is_one_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert "ValueError: boom" in orjson.loads(line)["exception"]


def test_text_lines_tag_the_ids() -> None:
    with bound(request_id="r-2"):
        line = TextFormatter().format(_record("hi"))
    assert line.endswith("WARNING director.x [request_id=r-2]: hi")
    assert TextFormatter().format(_record("hi")).endswith("WARNING director.x: hi")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="CONDUIT_LOG_FORMAT"):
        configure("INFO", "yaml")


@pytest.mark.parametrize(
    ("value", "adopted"),
    [
        ("abc-DEF_0.9", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("", False),
        ("a b", False),
        ("a\nb", False),
        ("ä", False),
        (None, False),
    ],
)
def test_sane_request_ids(value: str | None, adopted: bool) -> None:
    assert (sane_request_id(value) is not None) is adopted
    assert sane_request_id(new_request_id()) is not None


def test_shutdown_outlasts_the_longest_wait() -> None:
    assert ApiSettings.model_fields["shutdown_timeout"].default > MAX_WAIT
