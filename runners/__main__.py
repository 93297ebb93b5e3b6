"""``python -m runners MODEL``: serve one model with Cog's HTTP API (coglet's env vars apply);
``python -m runners pool --config pool.yaml``: many models in one process (runners.pool).

It listens on loopback unless ``--host`` says otherwise (``--host 0.0.0.0`` in a container);
reachable over a network, it should have ``CONDUIT_RUNNER_TOKEN`` (see :mod:`runners.auth`).
This entry point imports only ``runners``, ``protocol`` and ``core``: a runner image installs
the project without its dependencies and then the ``runner`` dependency group alone. It warns
of ``CONDUIT_*`` variables no Conduit process reads, as every ``conduit`` process does.
"""

from __future__ import annotations

import argparse
import os

from core.env_names import warn_unknown
from core.logs import configure_from_env


def serve_named(
    model: str,
    host: str,
    port: int,
    concurrency: int,
    weights: str | None = None,
    config: str | None = None,
    prog: str = "python -m runners",
) -> None:
    """Serve ``model``, or the model pool ``config`` describes when ``model`` is ``pool``."""
    if model == "pool":
        from runners.pool.config_file import PoolFileError, load
        from runners.pool.http import serve as serve_pool

        if not config:
            raise SystemExit(f"{prog} pool: --config is required")
        try:
            load(config)
        except PoolFileError as error:
            raise SystemExit(f"{prog} pool: {error}") from None
        serve_pool(config, host, port)
        return
    from runners.server import serve

    serve(model, host, port, concurrency, {"model": weights} if weights else {})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runners", description=__doc__)
    parser.add_argument("model", help="registered model name, e.g. echo; or pool, with --config")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "5000")))
    parser.add_argument(
        "--concurrency", type=int, default=int(os.environ.get("COG_MAX_CONCURRENCY", "1"))
    )
    parser.add_argument(
        "--model",
        dest="weights",
        help="what the model serves, for models that take it (vllm: a local path or model id)",
    )
    parser.add_argument("--config", help="pool: the pool's YAML or TOML file")
    args = parser.parse_args()
    configure_from_env()
    warn_unknown(os.environ)  # as ``conduit``'s processes do, from the names core declares
    serve_named(args.model, args.host, args.port, args.concurrency, args.weights, args.config)


if __name__ == "__main__":
    main()
