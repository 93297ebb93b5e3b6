"""``conduit``: every Conduit process and operator command, each a subcommand; the parser,
its help, and what every command shares at start (logging, the check of ``CONDUIT_*`` names,
one line instead of a traceback when Postgres or Redis is out of reach)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent

DESCRIPTION = """\
Conduit, a self-hosted prediction platform with Replicate's API.

Processes: api, runner, director, gateway (and dev, all of them on this machine).
Operators: migrate, admin, config, pool. Run conduit COMMAND --help for each.
Every command reads DATABASE_URL and REDIS_URL where it needs them; conduit config
prints what a process would read."""

#: The commands that run as processes (or start them): they check the environment's
#: ``CONDUIT_*`` names at start.
PROCESSES = ("api", "runner", "director", "gateway", "migrate", "dev")


def from_env(text: str, name: str) -> str:
    """An option's help naming the variable that sets it when the option is left out."""
    return f"{text} [env: {name}]"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown where an option has one worth showing (not None, not a bare switch);
    descriptions printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, "", argparse.SUPPRESS) or "default" in (
            action.help or ""
        ):
            return action.help
        return super()._get_help_string(action)


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose ``help`` is also their description (``COMMAND --help`` says what it
    does)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if kwargs.get("help") and "description" not in kwargs:
            text = str(kwargs["help"])
            kwargs["description"] = text[0].upper() + text[1:] + "."
        return super().add_parser(name, **kwargs)  # type: ignore[no-any-return]


class Parser(argparse.ArgumentParser):
    """Every parser of the tree: the help formatter above, subcommands as ``_Commands``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)


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
    # Alembic says at INFO which of its plug-ins it loaded, on import and before alembic.ini's
    # levels apply: nothing an operator acts on.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
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

    overrides: dict[str, Any] = {}
    if args.deployment:
        overrides["deployment"] = args.deployment
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
    if args.env:
        from conduit.dev_exports import ENV_FILE, StaleEnvFile, read_env_file

        try:
            exports = read_env_file()
        except StaleEnvFile as stale:  # its conduit dev was killed: not a stack to export
            raise SystemExit(f"conduit dev --env: {stale}") from None
        if exports is None:
            raise SystemExit(f"conduit dev --env: no {ENV_FILE} here; is conduit dev running?")
        print(exports, end="")
        return
    from conduit.dev import run_dev

    sys.exit(run_dev(args.port, args.with_files, args.with_gateway))


def cmd_config(args: argparse.Namespace) -> None:
    from conduit.effective_config import render
    from conduit.env_check import unknown_names

    for name, nearest in unknown_names(os.environ):
        hint = f" (did you mean {nearest}?)" if nearest else ""
        print(f"# {name} is not a Conduit setting; it is ignored{hint}")
    print(render(args.process or PROCESS_NAMES))


PROCESS_NAMES = ("api", "director", "gateway", "runner")


def cmd_pool_simulate(args: argparse.Namespace) -> None:
    from runners.pool.simulate import run

    try:
        print(run(args.trace, args.budget, args.policy, args.queue))
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"conduit pool simulate: {error}") from None


def build_parser() -> argparse.ArgumentParser:
    from conduit.admin.parser import add_admin  # it runs its commands with run_async, above

    parser = Parser(prog="conduit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"conduit {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser(
        "migrate", help="apply the database migrations (DATABASE_URL) up to the newest"
    ).set_defaults(func=cmd_migrate)

    api = sub.add_parser("api", help="serve the public API (REST, /ops, /metrics)")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on")
    api.add_argument("--port", type=int, default=8000, help="port to listen on")
    api.set_defaults(func=cmd_api)

    runner = sub.add_parser("runner", help="serve a model with Cog's HTTP protocol")
    runner.add_argument("model", help="model name, e.g. echo or files; or pool, with --config")
    runner.add_argument("--host", default="127.0.0.1", help="address to listen on")
    runner.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", "5000")),
        help=from_env("port to listen on", "PORT"),
    )
    runner.add_argument("--concurrency", type=int, default=1, help="predictions at once")
    runner.add_argument(
        "--model",
        dest="weights",
        help="what the model serves, for models that take it (vllm: a local path or model id)",
    )
    runner.add_argument("--config", help="runner pool: the pool's YAML or TOML file")
    runner.set_defaults(func=cmd_runner)

    _add_director(sub)

    gateway = sub.add_parser(
        "gateway", help="serve the gRPC inference gateway (BlockInferenceService, health)"
    )
    gateway.add_argument(
        "--host", help=from_env("address to listen on (default 127.0.0.1)", "CONDUIT_GATEWAY_HOST")
    )
    gateway.add_argument(
        "--port",
        type=int,
        help=from_env("port to listen on (default 50051)", "CONDUIT_GATEWAY_PORT"),
    )
    gateway.set_defaults(func=cmd_gateway)

    add_admin(sub)

    config = sub.add_parser(
        "config",
        help="print the settings a process would run with, read from this environment "
        "(secrets masked)",
    )
    config.add_argument(
        "process",
        nargs="*",
        choices=[*PROCESS_NAMES, []],
        metavar="PROCESS",
        help=f"one or more of {', '.join(PROCESS_NAMES)} (default: all)",
    )
    config.set_defaults(func=cmd_config)

    pool = sub.add_parser("pool", help="the model pool's scheduler, offline")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True, metavar="COMMAND")
    simulate = pool_sub.add_parser(
        "simulate", help="replay a request trace on a fake clock; print loads, waits, evictions"
    )
    simulate.add_argument(
        "--trace", required=True, type=Path, help="JSON lines (see docs/concepts/model-pool.md)"
    )
    simulate.add_argument("--budget", default="24GiB", help="memory budget, e.g. 24GiB")
    simulate.add_argument(
        "--policy", choices=["lru", "cost"], default="lru", help="which model to evict"
    )
    simulate.add_argument(
        "--queue", choices=["warm", "fifo"], default="warm", help="which request to serve next"
    )
    simulate.set_defaults(func=cmd_pool_simulate)

    _add_dev(sub)
    return parser


def _add_director(sub: Any) -> None:
    director = sub.add_parser(
        "director",
        help="run predictions of a deployment on a runner, or of several on a model pool's slots",
    )
    director.add_argument(
        "--deployment",
        action=_CommaJoined,
        metavar="OWNER/NAME[=MODEL]",
        help=from_env(
            "the deployment; repeat with --pool-url: each deployment runs on the pool's slot "
            "MODEL (default: NAME)",
            "CONDUIT_DIRECTOR_DEPLOYMENT",
        ),
    )
    director.add_argument(
        "--runner-url",
        help=from_env("the runner (default http://127.0.0.1:5000)", "CONDUIT_DIRECTOR_RUNNER_URL"),
    )
    director.add_argument(
        "--pool-url",
        help=from_env(
            "a model pool host (conduit runner pool): the deployments run on its slots, "
            "entries of loaded models first",
            "CONDUIT_DIRECTOR_POOL_URL",
        ),
    )
    director.add_argument(
        "--concurrency",
        type=int,
        help=from_env("predictions at once (default 1)", "CONDUIT_DIRECTOR_CONCURRENCY"),
    )
    director.add_argument(
        "--runner-public-url",
        help=from_env(
            "the runner's URL as api replicas reach it, for the fleet (default: --runner-url)",
            "CONDUIT_DIRECTOR_RUNNER_PUBLIC_URL",
        ),
    )
    director.add_argument(
        "--version",
        help=from_env(
            "the version the runner serves (default: the deployment's now); read only its own "
            "streams until the deployment runs it (a release's new fleet, started ahead)",
            "CONDUIT_DIRECTOR_VERSION",
        ),
    )
    director.set_defaults(func=cmd_director)


def _add_dev(sub: Any) -> None:
    dev = sub.add_parser(
        "dev",
        help="the whole stack on this machine, for a first run (throwaway Postgres and Redis "
        "unless DATABASE_URL and REDIS_URL are set)",
    )
    dev.add_argument("--port", type=int, default=8000, help="the api's port")
    dev.add_argument(
        "--with-files",
        action="store_true",
        help="also serve the file model conduit/files (input file, output a copy of it)",
    )
    dev.add_argument(
        "--with-gateway", action="store_true", help="also serve the gRPC inference gateway"
    )
    dev.add_argument(
        "--env",
        action="store_true",
        help="print the running dev stack's exports (its .conduit/dev.env), for "
        'eval "$(conduit dev --env)" in another shell; starts nothing',
    )
    dev.set_defaults(func=cmd_dev)


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
    if args.command in PROCESSES:
        from conduit.env_check import warn_unknown

        warn_unknown(os.environ)
    try:
        args.func(args)
    except Exception as error:
        said = _outage(error)
        if said is None:
            raise
        print(f"conduit {args.command}: {said}", file=sys.stderr)
        sys.exit(2)


def _outage(error: Exception) -> str | None:
    """One line when ``error`` says Postgres or Redis is out of reach (conduit.outages)."""
    from conduit.outages import unreachable

    return unreachable(
        error,
        os.environ.get("DATABASE_URL", "the default DATABASE_URL"),
        os.environ.get("REDIS_URL", "the default REDIS_URL"),
    )
