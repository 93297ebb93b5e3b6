"""``conduit``: every Conduit process and operator command, each a subcommand; the parser,
its help, and what every command shares at start (logging, the check of ``CONDUIT_*`` names,
one line instead of a traceback when Postgres or Redis is out of reach)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conduit.commands import (
    PROCESS_NAMES,
    cmd_api,
    cmd_config,
    cmd_dev,
    cmd_director,
    cmd_gateway,
    cmd_migrate,
    cmd_pool_simulate,
    cmd_runner,
)

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


def build_parser() -> argparse.ArgumentParser:
    from conduit.admin.parser import add_admin

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
