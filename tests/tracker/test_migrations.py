"""Migrations that a rolling upgrade crosses: processes of the earlier release keep writing
while processes of this one run."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from tests.fixtures.servers import create_database

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


def test_owners_become_accounts_and_rows_carry_over(services: ServiceUrls) -> None:
    """0007 on a database whose models and deployments name owners without accounts."""
    url = create_database(services.database_url, f"conduit_migrate_{uuid.uuid4().hex[:12]}")
    migrate(url, "0006")
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        kept = conn.execute(
            "INSERT INTO accounts (name, webhook_secret) VALUES ('kept', 'whsec_k') RETURNING id"
        ).fetchone()
        assert kept is not None
        models = {}
        for owner, name in (("kept", "m"), ("orphan", "m"), ("orphan", "n")):
            row = conn.execute(
                "INSERT INTO models (owner, name, visibility) VALUES (%s, %s, 'private') "
                "RETURNING id",
                (owner, name),
            ).fetchone()
            assert row is not None
            models[f"{owner}/{name}"] = row[0]
        conn.execute(
            "INSERT INTO versions (id, model_id, openapi_schema) VALUES ('v1', %s, '{}')",
            (models["orphan/m"],),
        )
        conn.execute(
            "INSERT INTO deployments (owner, name, model_id, version_id, priority) "
            "VALUES ('team', 'd', %s, 'v1', 'high')",
            (models["orphan/m"],),
        )

        migrate(url, "0007")

        accounts: dict[str, int] = dict(conn.execute("SELECT name, id FROM accounts").fetchall())
        assert set(accounts) == {"kept", "orphan", "team"}
        assert accounts["kept"] == kept[0]
        created = conn.execute(
            "SELECT name, webhook_secret, active, may_use_high_priority FROM accounts "
            "WHERE name <> 'kept' ORDER BY name"
        ).fetchall()
        for name, secret, active, high in created:
            assert secret.startswith("whsec_") and len(secret) > 40, name
            assert (active, high) == (True, False)
        assert len({row[1] for row in created}) == 2  # a secret of its own each
        tokens = conn.execute("SELECT count(*) FROM api_tokens").fetchone()
        assert tokens == (0,)  # create-account NAME gives one later

        carried = conn.execute("SELECT owner, name, id, visibility FROM models").fetchall()
        assert {(o, n): (i, v) for o, n, i, v in carried} == {
            ("kept", "m"): (models["kept/m"], "private"),
            ("orphan", "m"): (models["orphan/m"], "private"),
            ("orphan", "n"): (models["orphan/n"], "private"),
        }
        deployment = conn.execute(
            "SELECT owner, name, version_id, priority, visibility, allow_high_priority "
            "FROM deployments"
        ).fetchall()
        # Existing deployments stay usable by everyone, as before the upgrade.
        assert deployment == [("team", "d", "v1", "high", "public", False)]

        # From now on an owner must be an account, and an owning account keeps its name.
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO models (owner, name) VALUES ('nobody', 'm')")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("UPDATE accounts SET name = 'renamed' WHERE name = 'team'")
        # A row the earlier release inserts (no visibility) is still public.
        conn.execute(
            "INSERT INTO deployments (owner, name, model_id, version_id) "
            "VALUES ('orphan', 'old-release', %s, 'v1')",
            (models["orphan/m"],),
        )
        visibility = conn.execute(
            "SELECT visibility FROM deployments WHERE name = 'old-release'"
        ).fetchone()
        assert visibility == ("public",)
        conn.execute(
            "INSERT INTO grants (account_id, model_id) VALUES (%s, %s)",
            (accounts["team"], models["orphan/n"]),
        )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO grants (account_id) VALUES (%s)", (accounts["team"],))
