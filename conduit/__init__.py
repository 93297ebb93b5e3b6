"""The ``conduit`` command: one CLI for every process.

Subcommands: api, director, runner, migrate, admin, dev.
"""
