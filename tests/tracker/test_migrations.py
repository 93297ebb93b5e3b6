"""Migrations that a rolling upgrade crosses: processes of the earlier release keep writing
while processes of this one run."""

from __future__ import annotations

import re
import uuid

import psycopg

from conduit.cli import migrate
from conduit.services import ServiceUrls, create_database

_INSERT = (
    "INSERT INTO predictions (id, account_id, model, version_id, input, {column}) "
    "VALUES (%s, %s, 'o/m', 'v1', '{{}}', %s)"
)


def _conninfo(url: str) -> str:
    return re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)


def _targets(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    rows = conn.execute("SELECT id, stream, target FROM predictions").fetchall()
    return {str(row[0]): (row[1], row[2]) for row in rows}


def test_predictions_target_is_filled_whichever_release_inserts(services: ServiceUrls) -> None:
    url = create_database(services.database_url, f"conduit_migrate_{uuid.uuid4().hex[:12]}")
    migrate(url, "0005")
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        account = conn.execute(
            "INSERT INTO accounts (name, webhook_secret) VALUES ('a', 's') RETURNING id"
        ).fetchone()
        assert account is not None
        model = conn.execute(
            "INSERT INTO models (owner, name) VALUES ('o', 'm') RETURNING id"
        ).fetchone()
        assert model is not None
        conn.execute(
            "INSERT INTO versions (id, model_id, openapi_schema) VALUES ('v1', %s, '{}')",
            (model[0],),
        )
        conn.execute(_INSERT.format(column="stream"), ("before", account[0], "dp-o/d"))

        migrate(url)  # this release's schema, while the earlier release still runs

        conn.execute(_INSERT.format(column="stream"), ("earlier", account[0], "dp-o/d"))
        conn.execute(_INSERT.format(column="target"), ("this", account[0], "vp-v1"))
        assert _targets(conn) == {
            "before": ("dp-o/d", "dp-o/d"),
            "earlier": ("dp-o/d", "dp-o/d"),
            "this": ("vp-v1", "vp-v1"),
        }
