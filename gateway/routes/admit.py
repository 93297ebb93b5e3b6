"""The front door's admission (:class:`front.admission.Admission`) for the gateway's tasks, its
refusals answered as gRPC statuses: a task's input is named under ``data``, and undeclared
fields pass on (a graph's step is handed its parent's whole output)."""

from __future__ import annotations

from typing import Any

from catalog.records import AccountInfo
from files.service import Files
from front.admission import Admission
from front.destinations import Destination
from gateway import block_input
from gateway.destinations import Destinations
from gateway.errors import InvalidArgument, ResourceExhausted
from gateway.task import Task
from tracker.input_checks import RefusedInput
from tracker.rate_limits import OverRate

#: Where a task's input is named in what is refused.
ROOT = "data"


class TaskAdmission:
    def __init__(self, admission: Admission, destinations: Destinations, files: Files) -> None:
        self.admission = admission
        self.destinations = destinations
        self.files = files

    async def count_creates(self, account: AccountInfo, count: int) -> None:
        """Count the predictions a task makes against the account's rate of creates (as the
        api counts its own): past it, ``RESOURCE_EXHAUSTED`` with ``retry-after``."""
        try:
            await self.admission.count_creates(account.id, count)
        except OverRate as over:
            wait = over.retry_after
            trailing = (("retry-after", str(wait)),) if wait is not None else ()
            raise ResourceExhausted(over.detail, trailing=trailing) from None

    async def checked_input(
        self, account: AccountInfo, destination: Destination, task: Task
    ) -> tuple[dict[str, Any], bytes]:
        """The task's input, checked and its files stored; and its canonical JSON."""
        await self.destinations.check_served(destination)
        await self.check_with_files(account, destination, block_input.compose(task))
        input = await block_input.attach_files(self.files, account.id, task)
        return input, self.canonical(input)

    async def check_with_files(
        self, account: AccountInfo, destination: Destination, input: dict[str, Any]
    ) -> None:
        """:meth:`check`, and refuse file references (``/v1/files/{id}`` URLs) to anything
        but the account's own live uploads."""
        self.check(destination, input)
        try:
            await self.admission.files(account.id, input, root=ROOT)
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None

    def check(self, destination: Destination, input: dict[str, Any]) -> None:
        try:
            self.admission.input(destination, input, ROOT, declared_only=False)
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None

    def canonical(self, input: dict[str, Any]) -> bytes:
        try:
            return self.admission.canonical(input, ROOT)
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None
