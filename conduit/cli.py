"""``conduit``: migrate, api, runner, director, gateway, admin and dev, each a subcommand."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


def database_url() -> str:
    from api.settings import ApiSettings

    return ApiSettings().database_url


def migrations_dir() -> Path:
    """The alembic scripts: ``conduit/migrations`` in an installed wheel (where the top-level
    ``alembic/`` of the source tree ships), else ``alembic/`` of this checkout."""
    installed = Path(__file__).resolve().parent / "migrations"
    return installed if (installed / "env.py").is_file() else ROOT / "alembic"


def migrate(url: str | None = None, revision: str = "head") -> None:
    from alembic.config import Config

    from alembic import command

    ini = ROOT / "alembic.ini"  # logging levels; only in a checkout
    config = Config(str(ini)) if ini.is_file() else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", (url or database_url()).replace("%", "%%"))
    command.upgrade(config, revision)


def cmd_migrate(args: argparse.Namespace) -> None:
    migrate()
    print("database migrated to head")


def cmd_api(args: argparse.Namespace) -> None:
    import uvicorn

    from api.app import create_app
    from api.connections import ConnectionLimits
    from api.http_protocol import guarded_protocol
    from api.settings import ApiSettings

    settings = ApiSettings()
    trusted = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        loop="uvloop",
        # httptools, with what a connection may hold bounded (api.connections): head and body
        # timeouts, head size, connections per client address, pipelined requests.
        http=guarded_protocol(ConnectionLimits.from_settings(settings)),
        ws="none",  # no route is a WebSocket: an upgrade request is served as plain HTTP
        access_log=False,
        log_level="warning",
        # uvicorn's loggers go through the process's own handler (core.logs), so
        # CONDUIT_LOG_FORMAT=json covers its lines too.
        log_config=None,
        # Open requests get this long to end after SIGTERM. Waiters are answered at once then
        # (api.app.release_on_exit_signals); the bound keeps an SSE client or a slow upload
        # from holding the shutdown past what the orchestrator allows.
        timeout_graceful_shutdown=settings.shutdown_timeout,
        timeout_keep_alive=settings.keep_alive_timeout,
        # X-Forwarded-For names the client only when a trusted proxy sent it (uvicorn would
        # otherwise trust any loopback peer): failed logins are counted per client address.
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
    )


def cmd_runner(args: argparse.Namespace) -> None:
    """``conduit runner MODEL``, or ``conduit runner pool --config pool.yaml``: what
    ``python -m runners`` serves (a runner image runs that, without this package's imports)."""
    from runners.__main__ import serve_named

    serve_named(
        args.model,
        args.host,
        args.port,
        args.concurrency,
        args.weights,
        args.config,
        prog="conduit runner",
    )


class _CommaJoined(argparse.Action):
    """A repeatable option read as one comma-separated value, as its environment variable
    is (``--deployment a/b --deployment c/d`` is ``CONDUIT_DIRECTOR_DEPLOYMENT=a/b,c/d``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        earlier = getattr(namespace, self.dest, None)
        value = str(values)
        setattr(namespace, self.dest, f"{earlier},{value}" if earlier else value)


def cmd_director(args: argparse.Namespace) -> None:
    from director.process import serve
    from director.settings import DirectorSettings

    overrides: dict[str, Any] = {"deployment": args.deployment}
    if args.runner_url:
        overrides["runner_url"] = args.runner_url
    if args.pool_url:
        overrides["pool_url"] = args.pool_url
    if args.concurrency:
        overrides["concurrency"] = args.concurrency
    if args.runner_public_url:
        overrides["runner_public_url"] = args.runner_public_url
    if args.version:
        overrides["version"] = args.version
    settings = DirectorSettings(**overrides)
    try:
        settings.routes()
    except ValueError as error:
        raise SystemExit(f"conduit director: {error}") from None
    run_async(serve(settings))


def cmd_gateway(args: argparse.Namespace) -> None:
    from gateway.server import serve
    from gateway.settings import GatewaySettings

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    run_async(serve(GatewaySettings(**overrides)))


def cmd_dev(args: argparse.Namespace) -> None:
    from conduit.dev import run_dev

    sys.exit(run_dev(port=args.port))


def cmd_pool_simulate(args: argparse.Namespace) -> None:
    from runners.pool.simulate import run

    try:
        print(run(args.trace, args.budget, args.policy, args.queue))
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"conduit pool simulate: {error}") from None


def build_parser() -> argparse.ArgumentParser:
    from conduit.admin.parser import add_admin  # it runs its commands with run_async, above

    parser = argparse.ArgumentParser(prog="conduit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"conduit {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)

    api = sub.add_parser("api", help="serve the public API")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.set_defaults(func=cmd_api)

    runner = sub.add_parser("runner", help="serve a model with Cog's HTTP protocol")
    runner.add_argument("model", help="model name, e.g. echo; or pool, with --config")
    runner.add_argument("--host", default="127.0.0.1")
    runner.add_argument("--port", type=int, default=int(os.environ.get("PORT", "5000")))
    runner.add_argument("--concurrency", type=int, default=1)
    runner.add_argument(
        "--model",
        dest="weights",
        help="what the model serves, for models that take it (vllm: a local path or model id)",
    )
    runner.add_argument("--config", help="runner pool: the pool's YAML or TOML file")
    runner.set_defaults(func=cmd_runner)

    director = sub.add_parser(
        "director",
        help="run predictions of a deployment on a runner, or of several on a model pool's slots",
    )
    director.add_argument(
        "--deployment",
        required=True,
        action=_CommaJoined,
        metavar="OWNER/NAME[=MODEL]",
        help="repeat with --pool-url: each deployment runs on the pool's slot MODEL "
        "(default: NAME)",
    )
    director.add_argument("--runner-url")
    director.add_argument(
        "--pool-url",
        help="a model pool host (conduit runner pool): the deployments run on its slots, "
        "entries of loaded models first",
    )
    director.add_argument("--concurrency", type=int)
    director.add_argument(
        "--runner-public-url",
        help="the runner's URL as api replicas reach it, for the fleet (default: --runner-url)",
    )
    director.add_argument(
        "--version",
        help="the version the runner serves (default: the deployment's now); read only its own "
        "streams until the deployment runs it (a release's new fleet, started ahead)",
    )
    director.set_defaults(func=cmd_director)

    gateway = sub.add_parser(
        "gateway", help="serve the gRPC inference gateway (BlockInferenceService, health)"
    )
    gateway.add_argument("--host", help="default: CONDUIT_GATEWAY_HOST, else 127.0.0.1")
    gateway.add_argument("--port", type=int, help="default: CONDUIT_GATEWAY_PORT, else 50051")
    gateway.set_defaults(func=cmd_gateway)

    add_admin(sub)

    pool = sub.add_parser("pool", help="the model pool's scheduler")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    simulate = pool_sub.add_parser(
        "simulate", help="replay a request trace on a fake clock; print loads, waits, evictions"
    )
    simulate.add_argument("--trace", required=True, type=Path, help="JSON lines (see README)")
    simulate.add_argument("--budget", default="24GiB", help="memory budget, e.g. 24GiB")
    simulate.add_argument("--policy", choices=["lru", "cost"], default="lru")
    simulate.add_argument("--queue", choices=["warm", "fifo"], default="warm")
    simulate.set_defaults(func=cmd_pool_simulate)

    dev = sub.add_parser("dev", help="the whole stack on this machine, for a first run")
    dev.add_argument("--port", type=int, default=8000)
    dev.set_defaults(func=cmd_dev)
    return parser


def configure_logging() -> None:
    """``CONDUIT_LOG_LEVEL`` (default INFO) and ``CONDUIT_LOG_FORMAT`` (``text`` or ``json``),
    the same for every subcommand."""
    from core.logs import configure_from_env

    try:
        configure_from_env()
    except ValueError as error:
        raise SystemExit(f"conduit: {error}") from None


def package_version() -> str:
    """The installed distribution's version: what ``pip`` and the image installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("conduit")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging()
    args.func(args)
