"""The docs build as a site with MkDocs' strict check (``mkdocs.yml``; ``scripts/test`` runs the
same build), and that check does fail on a broken link, a missing anchor and a page left out of
the navigation, so a green build means something."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = [sys.executable, "-m", "mkdocs"]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MKDOCS, "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").is_file()
    # The command-line reference is filled in from the parser (conduit/cli_doc.py, a hook).
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "&lt;!-- cli-help --&gt;" not in cli and "<!-- cli-help -->" not in cli
    for command in ("conduit migrate", "conduit admin", "conduit pool simulate"):
        assert command in cli, command


@pytest.mark.parametrize(
    ("page", "text", "complaint"),
    [
        ("index.md", "[gone](tutorials/nothing.md)", "is not found"),
        ("index.md", "[gone](getting-started.md#no-such-heading)", "does not contain an anchor"),
        ("stray.md", "# Nowhere in the nav", 'not included in the "nav"'),
    ],
)
def test_a_broken_link_or_a_stray_page_fails_the_build(
    tmp_path: Path, page: str, text: str, complaint: str
) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "conduit").symlink_to(ROOT / "conduit")  # the hook mkdocs.yml names
    with (copy / "docs" / page).open("a") as file:
        file.write(f"\n{text}\n")
    built = _build(copy, tmp_path / "site")
    assert built.returncode != 0
    assert complaint in built.stderr, built.stderr


def test_the_readme_links_lead_somewhere() -> None:
    """The README is outside the site, so the strict build does not check its links."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    for target in targets:
        if "://" not in target:
            assert (ROOT / target).exists(), target
