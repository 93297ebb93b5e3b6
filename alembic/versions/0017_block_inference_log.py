"""block_inference: the gateway's request log (the seed's table, plus status, error, latency,
account and graph parent), partitioned by day on ``ts``; a TimescaleDB hypertable with a
retention policy instead when the ``timescaledb`` extension is installed in the database

A new table only, written by gateways that log (``CONDUIT_GATEWAY_LOG``): live-safe. The
partitions are made (and dropped past the retention) by the gateways that write it
(:mod:`blocks.request_log`).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-12 10:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = """
    request_id uuid NOT NULL,
    session_id text NOT NULL DEFAULT '',
    block_id text NOT NULL DEFAULT '',
    seq_no integer NOT NULL DEFAULT 0,
    ts timestamptz NOT NULL,
    frame_ptr bytea,
    data bytea,
    query_parameters bytea,
    output_ptr bytea,
    status text NOT NULL,
    error text,
    latency_ms real NOT NULL,
    account_id bigint,
    origin text,
    graph_parent uuid
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    conn = op.get_bind()
    timescale = conn.exec_driver_sql(
        "SELECT 1 FROM pg_extension WHERE extname = 'timescaledb'"
    ).first()
    if timescale is not None:
        op.execute(f"CREATE TABLE block_inference ({COLUMNS}, PRIMARY KEY (request_id, ts))")
        op.execute("SELECT create_hypertable('block_inference', 'ts', if_not_exists => TRUE)")
        op.execute("SELECT add_retention_policy('block_inference', INTERVAL '7 days')")
    else:
        op.execute(
            f"CREATE TABLE block_inference ({COLUMNS}, PRIMARY KEY (request_id, ts))"
            " PARTITION BY RANGE (ts)"
        )
    op.execute("CREATE INDEX ix_block_inference_session ON block_inference (session_id, ts)")
    op.execute("CREATE INDEX ix_block_inference_block ON block_inference (block_id, ts)")
    op.execute("CREATE INDEX ix_block_inference_account ON block_inference (account_id, ts)")


def downgrade() -> None:
    op.execute("DROP TABLE block_inference")
