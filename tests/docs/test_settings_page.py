"""The settings reference is generated: the committed page is what its generator prints, so a
setting added, renamed or re-described in a settings class without regenerating the page
fails here."""

from __future__ import annotations

from conduit import settings_doc
from conduit.settings_catalog import ROOT, process_env_names

PAGE = ROOT / "docs" / "reference" / "settings.md"


def test_the_committed_page_is_what_the_generator_prints() -> None:
    assert PAGE.read_text() == settings_doc.render(), (
        "docs/reference/settings.md is stale: run "
        "`.venv/bin/python -m conduit.settings_doc > docs/reference/settings.md`"
    )


def test_the_page_names_every_variable_every_process_reads() -> None:
    page = PAGE.read_text()
    for process in ("api", "director", "gateway", "runner", "migrate"):
        for name in process_env_names(process):
            assert f"`{name}`" in page, f"{name} ({process}) is missing from the page"
