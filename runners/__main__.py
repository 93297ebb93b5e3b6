"""``python -m runners MODEL``: serve one model with Cog's HTTP API (coglet's env vars apply).

It listens on loopback unless ``--host`` says otherwise (``--host 0.0.0.0`` in a container);
reachable over a network, it should have ``CONDUIT_RUNNER_TOKEN`` (see :mod:`runners.auth`).
"""

from __future__ import annotations

import argparse
import os

from core.logs import configure_from_env
from runners.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runners", description=__doc__)
    parser.add_argument("model", help="registered model name, e.g. echo")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "5000")))
    parser.add_argument(
        "--concurrency", type=int, default=int(os.environ.get("COG_MAX_CONCURRENCY", "1"))
    )
    args = parser.parse_args()
    configure_from_env()
    serve(args.model, args.host, args.port, args.concurrency)


if __name__ == "__main__":
    main()
