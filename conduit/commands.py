"""What ``conduit``'s process and operator commands do once parsed (:mod:`conduit.cli` names
them and their options): each imports what it runs only when it runs."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from conduit.runtime import migrate, run_async

#: The processes ``conduit config`` prints the settings of.
PROCESS_NAMES = ("api", "director", "gateway", "runner")


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
    from core.env_names import describe

    for name, nearest in unknown_names(os.environ):
        print(f"# {describe(name, nearest)}")
    print(render(args.process or PROCESS_NAMES))


def cmd_pool_simulate(args: argparse.Namespace) -> None:
    from runners.pool.simulate import run

    try:
        print(run(args.trace, args.budget, args.policy, args.queue))
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"conduit pool simulate: {error}") from None
