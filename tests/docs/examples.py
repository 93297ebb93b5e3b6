"""The code blocks of the docs pages, as the suite runs them (``tests/docs/test_examples.py``).

Every fenced block in a language the suite can run (``bash``/``sh``, ``python``, ``js``) is an
example. One that cannot run here says so in the page, on the line before its fence::

    <!-- not-run: needs a Kubernetes cluster -->

so that leaving one out is deliberate, and counted. A block a tutorial has the reader save
says so the same way (``<!-- file: predict.py -->``): it is written there (a Python one
compiled), for the blocks after it. The rest run as printed, with only the
values a reader substitutes replaced: the api's URL, the token, and ids of things made before
the block runs (``<id>``, ``<urls.stream of the prediction>``, ``blk-…``) or served for it
(``conduit/files``), and the files of the reader's that it opens are made for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: The languages run, and what runs them.
RUNNABLE = {"bash": "bash", "sh": "bash", "python": "python", "js": "node"}

_FENCE = re.compile(r"^```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.+?)\s*-->$")
_FILE = re.compile(r"^<!--\s*file:\s*(\S+)\s*-->$")


@dataclass(frozen=True)
class Example:
    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: str | None  # the page's reason for not running it
    file: str | None = None  # the file the reader saves it as, rather than running it

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def examples(docs: Path = DOCS) -> list[Example]:
    found: list[Example] = []
    for path in sorted(docs.rglob("*.md")):
        found.extend(_blocks(path.relative_to(docs).as_posix(), path.read_text()))
    return found


def _blocks(page: str, text: str) -> list[Example]:
    lines = text.splitlines()
    found: list[Example] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        language = opening.group(1)
        if language in RUNNABLE:
            before = [line for line in lines[:index] if line.strip()]
            last = before[-1].strip() if before else ""
            marker = _NOT_RUN.match(last)
            saved = _FILE.match(last)
            code = "\n".join(lines[index + 1 : end]) + "\n"
            reason = marker.group(1) if marker else None
            file = saved.group(1) if saved else None
            found.append(Example(page, index + 1, language, code, reason, file))
        index = end + 1
    return found
