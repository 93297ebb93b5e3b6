"""The error reference is generated (``conduit.errors_doc``, an mkdocs hook) from the api's
problem classes: every class is on it, and what a class says of itself (the ``code`` values it
carries, whether it sends Retry-After) matches the api's code."""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import yaml

from api.errors import Problem
from conduit import errors_doc
from conduit.settings_catalog import ROOT

PAGE = ROOT / "docs" / "reference" / "errors.md"


def _subclasses(cls: type[Problem]) -> set[type[Problem]]:
    found = set()
    for child in cls.__subclasses__():
        found |= {child, *_subclasses(child)}
    return found


def test_the_page_carries_the_marker_and_mkdocs_fills_it() -> None:
    assert errors_doc.MARKER in PAGE.read_text()
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "conduit/errors_doc.py" in config["hooks"]
    assert errors_doc.MARKER not in errors_doc.on_page_markdown(PAGE.read_text())


def test_every_problem_class_is_on_the_page() -> None:
    page = errors_doc.render()
    classes = _subclasses(Problem)
    assert len(classes) >= 13
    for cls in classes:
        row = next((line for line in page.splitlines() if f"| `{cls.__name__}` |" in line), None)
        assert row is not None, f"{cls.__name__} is missing from the error reference"
        assert row.startswith(f"| {cls.status} |") and f"| {cls.title} |" in row, row


def _codes_raised() -> dict[str, set[str]]:
    """Each problem class's name: the literal ``code=`` values the api gives it."""
    problems = {cls.__name__ for cls in _subclasses(Problem)}
    codes: dict[str, set[str]] = defaultdict(set)
    for path in sorted((ROOT / "api").rglob("*.py")):
        tree = ast.parse(path.read_text())
        local = _problem_names(tree, path, problems)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in problems:
                for call in ast.walk(node):  # super().__init__(..., code="...") in the class
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                        codes[node.name] |= _literal_codes(call)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in local:
                    codes[local[node.func.id]] |= _literal_codes(node)
    return codes


def _problem_names(tree: ast.Module, path: Path, problems: set[str]) -> dict[str, str]:
    """The names a module calls the problem classes by."""
    if path == ROOT / "api" / "errors.py":
        return {name: name for name in problems}
    return {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "api.errors"
        for alias in node.names
        if alias.name in problems
    }


def _literal_codes(call: ast.Call) -> set[str]:
    return {
        keyword.value.value
        for keyword in call.keywords
        if keyword.arg == "code"
        and isinstance(keyword.value, ast.Constant)
        and isinstance(keyword.value.value, str)
    }


def test_each_class_lists_the_codes_the_api_gives_it() -> None:
    raised = _codes_raised()
    assert raised["Forbidden"], "the scan found no code: it no longer reads the api"
    for cls in _subclasses(Problem):
        assert set(cls.codes) == raised.get(cls.__name__, set()), cls.__name__


def test_each_class_says_whether_it_sends_retry_after() -> None:
    for cls in _subclasses(Problem):
        sends = "Retry-After" in inspect.getsource(cls).split('"""')[-1]  # past the docstring
        assert sends == (cls.sends_retry_after != "never"), cls.__name__
