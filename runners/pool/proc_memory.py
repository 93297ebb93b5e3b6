"""How much memory a process and its descendants hold, read from ``/proc`` (Linux)."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path


def rss(pid: int) -> int:
    """A process's resident set in bytes (``VmRSS``); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (Cog's server runs its model in a child)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo += _children(current)
    return found


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants."""
    return sum(rss(current) for current in tree_pids(pid))
