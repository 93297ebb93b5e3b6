"""Conduit's api on uvicorn's stock httptools protocol: ``conduit api`` less the connection
guard (:mod:`api.http_protocol`: head and body timeouts, connections per client, pipelining
bounds), so that ``bench.enqueue --costs`` can price that guard.

``python -m bench.baselines.stock_api --port P``, settings from the environment as for
``conduit api``. Never a way to serve Conduit: it drops what keeps a slow client from holding
the server.
"""

from __future__ import annotations

import argparse

import uvicorn

from api.app import create_app
from api.settings import ApiSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        create_app(ApiSettings()),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        access_log=False,
        log_level="warning",
        log_config=None,
    )


if __name__ == "__main__":
    main()
