"""The server binaries ``conduit dev`` and the tests run: find them, install them with
``apt-get`` when running as root on Debian/Ubuntu, and the account PostgreSQL runs as (it
refuses root). Nothing here starts a server (:mod:`conduit.child_server` does)."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

PG_BIN_GLOBS = (
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
    "/usr/local/opt/postgresql@*/bin",
)
_POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
_DEBIAN_VERSION = Path("/etc/debian_version")
_BREW_NAMES = {"redis-server": "redis", "postgresql": "postgresql@16"}


class ServicesUnavailable(RuntimeError):
    """Server binaries are missing (and could not be installed), or cannot be run here."""


def postgres_bindir() -> Path | None:
    """Directory holding ``initdb`` and ``postgres``: PATH first, then the highest version."""
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).parent / "postgres").exists():
        return Path(initdb).parent
    found = [Path(d) for pat in PG_BIN_GLOBS for d in glob.glob(pat)]
    found = [d for d in found if (d / "initdb").exists() and (d / "postgres").exists()]
    key = lambda d: tuple(int(n) for n in re.findall(r"\d+", str(d)))  # noqa: E731
    return max(found, key=key, default=None)


def _missing_packages(redis: bool, postgres: bool) -> list[str]:
    missing = []
    if redis and shutil.which("redis-server") is None:
        missing.append("redis-server")
    if postgres and postgres_bindir() is None:
        missing.append("postgresql")
    return missing


def install_hint(packages: list[str]) -> str:
    brew = " ".join(_BREW_NAMES[p] for p in packages)
    return (
        f"local server binaries missing ({', '.join(packages)}): install them with "
        f"`sudo apt-get install {' '.join(packages)}` (Debian/Ubuntu) or `brew install {brew}` "
        "(macOS), or set REDIS_URL/DATABASE_URL to existing servers"
    )


def apt_install(packages: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    created = not _POLICY_RC_D.exists()
    if created:  # forbid maintainer scripts from starting the distro's own services
        _POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n")
        _POLICY_RC_D.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update"], check=True, env=env)
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        subprocess.run(cmd, check=True, env=env)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ServicesUnavailable(f"apt-get failed ({exc}); {install_hint(packages)}") from exc
    finally:
        if created:
            _POLICY_RC_D.unlink(missing_ok=True)


def ensure_binaries(redis: bool = True, postgres: bool = True) -> None:
    """Make sure the requested server binaries exist, installing them via apt if possible."""
    missing = _missing_packages(redis, postgres)
    if not missing:
        return
    debian = _DEBIAN_VERSION.exists() and shutil.which("apt-get") is not None
    if os.geteuid() == 0 and debian:
        apt_install(missing)
        missing = _missing_packages(redis, postgres)
        if not missing:
            return
    raise ServicesUnavailable(install_hint(missing))


def postgres_account() -> dict[str, Any]:
    """Popen kwargs to run Postgres as ``postgres`` when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        if shutil.which("useradd") is None:
            raise ServicesUnavailable(
                "PostgreSQL refuses to run as root and there is no 'postgres' user: "
                "create one (`useradd --system --user-group postgres`) or run as a normal user"
            ) from None
        cmd = ["useradd", "--system", "--user-group", "--no-create-home", "postgres"]
        subprocess.run(cmd, check=True, capture_output=True)
        pw = pwd.getpwnam("postgres")
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def check_traversable(path: Path, uid: int, gid: int) -> None:
    for parent in path.parents:
        st = parent.stat()
        bit = (
            stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        )
        if not st.st_mode & bit:
            raise ServicesUnavailable(
                f"postgres runs as user 'postgres' (we are root) and cannot enter {parent}: "
                f"`chmod o+x {parent}` or use a workdir whose parents it can search"
            )
