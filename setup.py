"""Packaging that pyproject.toml cannot say (everything else is there): the migrations, kept
at the top-level ``alembic/`` of the source tree, ship inside the wheel as
``conduit/migrations`` (a top-level ``alembic`` would land in the alembic library's own
directory), where ``conduit migrate`` finds them."""

from setuptools import find_namespace_packages, setup

PACKAGES = [
    "core*",
    "protocol*",
    "runners*",
    "tracker*",
    "catalog*",
    "files*",
    "blocks*",
    "front*",
    "lane*",
    "director*",
    "gateway*",
    "api*",
    "conduit*",
]

setup(
    packages=[
        *find_namespace_packages(include=PACKAGES),
        "conduit.migrations",
        "conduit.migrations.versions",
    ],
    package_dir={"conduit.migrations": "alembic"},
    package_data={
        "conduit.migrations": ["script.py.mako"],
        "api.ops": ["templates/*.html", "static/*"],
    },
)
