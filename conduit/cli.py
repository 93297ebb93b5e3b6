"""``conduit``: migrate, api, runner, director, admin and dev, each a subcommand."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from tracker.priority import Priority

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


def _with_engine(work: Callable[[Any], Awaitable[T]]) -> T:
    from tracker.db import make_engine

    async def main() -> T:
        engine = make_engine(database_url(), pool_size=2)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return run_async(main())


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
    if args.model == "pool":
        cmd_runner_pool(args)
        return
    from runners.server import serve

    model_args = {"model": args.weights} if args.weights else {}
    serve(args.model, args.host, args.port, args.concurrency, model_args)


def cmd_runner_pool(args: argparse.Namespace) -> None:
    """``conduit runner pool --config pool.yaml``: many models in one process (runners.pool)."""
    from runners.pool.config_file import PoolFileError, load
    from runners.pool.http import serve

    if not args.config:
        raise SystemExit("conduit runner pool: --config is required")
    try:
        load(args.config)
    except PoolFileError as error:
        raise SystemExit(f"conduit runner pool: {error}") from None
    serve(args.config, args.host, args.port)


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
    settings = DirectorSettings(**overrides)
    try:
        settings.routes()
    except ValueError as error:
        raise SystemExit(f"conduit director: {error}") from None
    run_async(serve(settings))


def cmd_create_account(args: argparse.Namespace) -> None:
    from conduit import admin

    made_admin = True if args.admin else None
    print(_with_engine(lambda engine: admin.create_account(engine, args.name, made_admin)))


def cmd_set_admin(args: argparse.Namespace) -> None:
    from conduit import admin

    print(_with_engine(lambda engine: admin.set_admin(engine, args.account, not args.withdraw)))


def cmd_fleet(args: argparse.Namespace) -> None:
    from api.settings import ApiSettings
    from conduit import admin
    from tracker.redis_connect import connect

    async def main() -> str:
        redis = connect(ApiSettings().redis_url)
        try:
            return await admin.fleet(redis)
        finally:
            await redis.aclose()

    print(run_async(main()))


def cmd_create_model(args: argparse.Namespace) -> None:
    from conduit import admin

    print(
        _with_engine(
            lambda engine: admin.create_model(
                engine,
                args.name,
                args.runner_url,
                visibility=args.visibility,
                runner_token=args.runner_token or os.environ.get("CONDUIT_RUNNER_TOKEN") or None,
            )
        )
    )


def cmd_create_deployment(args: argparse.Namespace) -> None:
    from conduit import admin

    deployment = _with_engine(
        lambda engine: admin.create_deployment(
            engine,
            args.name,
            args.model,
            args.version,
            args.shards,
            args.prediction_timeout,
            args.max_attempts,
            args.priority,
            visibility=args.visibility,
            grants=args.grant,
            allow_high_priority=args.allow_high_priority,
        )
    )
    print(f"{deployment.full_name} release {deployment.release_number}: {deployment.version_id}")


def _kind(args: argparse.Namespace) -> tuple[Literal["model", "deployment"], str]:
    """(kind, OWNER/NAME) from a --model / --deployment pair of options."""
    return ("model", args.model) if args.model else ("deployment", args.deployment)


def cmd_grant(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print("\n".join(_with_engine(lambda engine: admin.grant(engine, args.accounts, kind, name))))


def cmd_revoke(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print("\n".join(_with_engine(lambda engine: admin.revoke(engine, args.accounts, kind, name))))


def cmd_set_visibility(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print(_with_engine(lambda engine: admin.set_visibility(engine, kind, name, args.visibility)))


def cmd_entitle_priority(args: argparse.Namespace) -> None:
    from conduit import admin

    if (args.account is None) == (args.deployment is None):
        raise SystemExit("entitle-priority: name an ACCOUNT or a --deployment, not both")
    print(
        _with_engine(
            lambda engine: admin.entitle_priority(
                engine, args.account, args.deployment, not args.withdraw
            )
        )
    )


def cmd_op_token(args: argparse.Namespace) -> None:
    from runners.optokens import issue, read_key

    signers = [name.strip() for name in args.signers.split(",") if name.strip()]
    key = read_key(args.key_file)
    print(issue(key, args.operation, args.model, signers, runner_id=args.runner))


def cmd_dev(args: argparse.Namespace) -> None:
    from conduit.dev import run_dev

    sys.exit(run_dev(port=args.port))


VISIBILITIES = ["public", "private"]


def _target(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="OWNER/NAME")
    which.add_argument("--deployment", metavar="OWNER/NAME")


def _add_sharing(admin_sub: Any) -> None:
    """Who may use private models and deployments, and who may ask for high priority."""
    grant = admin_sub.add_parser("grant", help="let accounts use a private model or deployment")
    grant.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(grant)
    grant.set_defaults(func=cmd_grant)
    revoke = admin_sub.add_parser("revoke", help="withdraw grants")
    revoke.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(revoke)
    revoke.set_defaults(func=cmd_revoke)
    visibility = admin_sub.add_parser(
        "set-visibility", help="make a model or deployment public or private"
    )
    _target(visibility)
    visibility.add_argument("visibility", choices=VISIBILITIES)
    visibility.set_defaults(func=cmd_set_visibility)
    entitle = admin_sub.add_parser(
        "entitle-priority", help="honour X-Priority: high from an account or on a deployment"
    )
    entitle.add_argument("account", nargs="?", metavar="ACCOUNT")
    entitle.add_argument("--deployment", metavar="OWNER/NAME")
    entitle.add_argument("--withdraw", action="store_true", help="stop honouring it")
    entitle.set_defaults(func=cmd_entitle_priority)


def cmd_pool_simulate(args: argparse.Namespace) -> None:
    from runners.pool.simulate import run

    try:
        print(run(args.trace, args.budget, args.policy, args.queue))
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"conduit pool simulate: {error}") from None


def build_parser() -> argparse.ArgumentParser:
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
    director.set_defaults(func=cmd_director)

    admin = sub.add_parser(
        "admin", help="manage accounts, models, deployments and who may use them"
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    account = admin_sub.add_parser("create-account", help="create an account; prints a token")
    account.add_argument("name")
    account.add_argument(
        "--admin", action="store_true", help="make it an admin (it may read GET /v1/fleet)"
    )
    account.set_defaults(func=cmd_create_account)
    set_admin = admin_sub.add_parser(
        "set-admin", help="make an account an admin (it may read GET /v1/fleet)"
    )
    set_admin.add_argument("account", metavar="ACCOUNT")
    set_admin.add_argument("--withdraw", action="store_true", help="make it an admin no more")
    set_admin.set_defaults(func=cmd_set_admin)
    fleet = admin_sub.add_parser(
        "fleet", help="list the runners of the fleet (REDIS_URL), with state and heartbeat age"
    )
    fleet.set_defaults(func=cmd_fleet)
    model = admin_sub.add_parser("create-model", help="register a model version from a runner")
    model.add_argument("name", metavar="OWNER/NAME")
    model.add_argument("--runner-url", required=True)
    model.add_argument(
        "--runner-token",
        help="the runner's CONDUIT_RUNNER_TOKEN (default: that variable; prefer it to the flag, "
        "which other users of the machine can read in the process list)",
    )
    model.add_argument(
        "--visibility",
        choices=VISIBILITIES,
        help="public (default for a new model) or private; unchanged when omitted on an existing",
    )
    model.set_defaults(func=cmd_create_model)
    deployment = admin_sub.add_parser("create-deployment", help="create or update a deployment")
    deployment.add_argument("name", metavar="OWNER/NAME")
    deployment.add_argument("--model", required=True, metavar="OWNER/NAME")
    deployment.add_argument("--version", help="version id (default: the model's latest)")
    deployment.add_argument("--shards", type=int, default=8)
    deployment.add_argument(
        "--prediction-timeout", type=float, default=1800.0, help="seconds (default 30 min)"
    )
    deployment.add_argument(
        "--max-attempts",
        type=int,
        default=1,
        help="runs a prediction may start; >1 re-runs one interrupted by a director's death",
    )
    deployment.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        default=Priority.NORMAL.value,
        help="X-Priority sent to the runner unless a request sets its own (default normal)",
    )
    deployment.add_argument(
        "--visibility",
        choices=VISIBILITIES,
        help="private (default for a new deployment) or public; unchanged when omitted on an "
        "existing one",
    )
    deployment.add_argument(
        "--grant",
        default="",
        metavar="ACCOUNT,ACCOUNT",
        help="accounts that may use it besides its owner (existing grants are kept)",
    )
    deployment.add_argument(
        "--allow-high-priority",
        action=argparse.BooleanOptionalAction,
        help="honour X-Priority: high from every account that may use it (unchanged if omitted)",
    )
    deployment.set_defaults(func=cmd_create_deployment)
    _add_sharing(admin_sub)
    op_token = admin_sub.add_parser(
        "op-token", help="mint a signed token for one runner lifecycle call"
    )
    op_token.add_argument(
        "--operation", required=True, choices=["model-load", "model-unload", "cache-flush"]
    )
    op_token.add_argument("--model", help="model id (omit for calls that name no model)")
    op_token.add_argument("--signers", required=True, metavar="NAME,NAME")
    op_token.add_argument("--key-file", required=True, help="the runner's op-token key")
    op_token.add_argument(
        "--runner",
        metavar="RUNNER_ID",
        help="accepted only by this runner (its runnerId in /v1/capabilities, CONDUIT_RUNNER_ID)",
    )
    op_token.set_defaults(func=cmd_op_token)

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
