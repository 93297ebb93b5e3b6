"""``list-<things>``, ``show-<thing>``, ``delete-<thing>``: the three commands every kind of
thing the admin manages has, made one way (their arguments, ``--json`` and ``--limit``, how
they print), so that accounts, models, deployments, blocks and graphs cannot drift apart."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.admin.running import with_engine
from conduit.admin.tables import add_list_options, listing, to_json

T = TypeVar("T")

#: What a command does with the database, given its parsed arguments.
Work = Callable[[AsyncEngine, argparse.Namespace], Awaitable[T]]


@dataclass(frozen=True)
class Collection(Generic[T]):
    #: ``account``: the commands are ``list-accounts``, ``show-account``, ``delete-account``.
    noun: str
    #: The argument naming one (``ACCOUNT``, ``OWNER/NAME``, ``BLOCK_ID``); its value is
    #: ``args.name``.
    metavar: str
    columns: Sequence[str]
    row: Callable[[T], Sequence[str]]
    read_all: Work[Sequence[T]]
    read_one: Work[object]
    delete: Work[str]
    #: Whether a delete changes what the catalogue caches of every process hold.
    catalog_change: bool = True
    #: Things of one account (graphs): each command names the account first, ``args.account``.
    per_account: bool = False
    #: How ``--json`` renders the list, when not as the rows are read.
    render: Callable[[Sequence[T]], object] | None = None

    def add(
        self, admin_sub: Any, *, list_help: str, show_help: str, delete_help: str
    ) -> argparse.ArgumentParser:
        """The three commands; returns ``delete-<thing>``'s parser, for options of its own."""
        listed = admin_sub.add_parser(f"list-{self.noun}s", help=list_help)
        self._account(listed)
        add_list_options(listed)
        listed.set_defaults(func=self._list)
        shown = admin_sub.add_parser(f"show-{self.noun}", help=show_help)
        self._account(shown)
        shown.add_argument("name", metavar=self.metavar)
        shown.set_defaults(func=self._show)
        deleted: argparse.ArgumentParser = admin_sub.add_parser(
            f"delete-{self.noun}", help=delete_help
        )
        self._account(deleted)
        deleted.add_argument("name", metavar=self.metavar)
        deleted.set_defaults(func=self._delete)
        return deleted

    def _account(self, parser: argparse.ArgumentParser) -> None:
        if self.per_account:
            parser.add_argument("account", metavar="ACCOUNT")

    def _list(self, args: argparse.Namespace) -> None:
        found = with_engine(lambda engine: self.read_all(engine, args))
        if args.json and self.render is not None:
            print(to_json(self.render(found)))
            return
        print(listing(found, self.columns, self.row, as_json=args.json, empty=f"no {self.noun}s"))

    def _show(self, args: argparse.Namespace) -> None:
        print(to_json(with_engine(lambda engine: self.read_one(engine, args))))

    def _delete(self, args: argparse.Namespace) -> None:
        work = self.delete
        print(with_engine(lambda engine: work(engine, args), catalog_change=self.catalog_change))
