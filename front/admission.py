"""Whether a request may be made, and the prediction it makes: the one admission of every entry.

In the order every entry applies it, before anything is stored:

1. the account's rate of creates (:meth:`Admission.count_creates`; a graph's steps counted
   together), shared in Redis by every api replica and gateway;
2. the input made canonical and storable, then checked against its version's schema
   (:meth:`Admission.input`), each refused field named under the entry's ``root``
   (``input`` for a prediction, ``data`` for a gateway task);
3. its file references, each one of the account's own live uploads (:meth:`Admission.files`);
4. the priority, honoured only where the account or the deployment is entitled to ``high``
   (:func:`honoured`);
5. the prediction built (:func:`new_prediction`), which :mod:`front.durable` stores and queues.

What is refused is :class:`~tracker.input_checks.RefusedInput` (naming each field) or
:class:`~tracker.rate_limits.OverRate`; each face answers them in its own terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from catalog.records import AccountInfo
from core.ids import new_prediction_id
from files.service import Files
from front.destinations import Destination
from front.settings import AdmissionSettings
from tracker.input_checks import FieldError, RefusedInput, canonical_input, check_input
from tracker.priority import Priority
from tracker.rate_limits import CreateRateLimit
from tracker.store import NewPrediction


def honoured(
    requested: Priority | None, account_may: bool, deployment_allows: bool
) -> Priority | None:
    """The priority a prediction is stored and run with: ``requested``, except an ``high`` that
    neither the account nor the deployment is entitled to (None: the deployment's applies).
    ``low`` and ``normal`` are never held back: asking for less is harmless."""
    if requested is Priority.HIGH and not (account_may or deployment_allows):
        return None
    return requested


@dataclass(frozen=True, slots=True)
class Admission:
    """One process's admission: its settings, its file store (None: no file store, so no
    file references to check) and the accounts' rate of creates (None: not limited)."""

    settings: AdmissionSettings
    stored_files: Files | None = None
    create_limit: CreateRateLimit | None = None

    async def count_creates(self, account_id: int, count: int = 1) -> None:
        """Count ``count`` creates against the account's rate: ``OverRate`` past it."""
        if self.create_limit is not None and count > 0:
            await self.create_limit.check(account_id, count)

    def canonical(self, input: dict[str, Any], root: str = "input") -> bytes:
        """The input as canonical JSON bytes, or RefusedInput naming each field that cannot be
        stored or sent."""
        return canonical_input(input, self.settings.max_input_depth, root=root)

    def input(
        self,
        destination: Destination,
        input: dict[str, Any],
        root: str = "input",
        *,
        declared_only: bool = True,
    ) -> bytes:
        """The input as canonical JSON bytes, once its version's schema accepts it.

        ``declared_only``: a field the schema does not declare is refused too (Cog would drop
        it and the run would succeed without it). A graph's step is handed its parent's whole
        output, so the gateway passes undeclared fields on instead (``False``)."""
        # Canonical first: the schema's messages quote the values, which must be sendable.
        input_json = self.canonical(input, root)
        check_input(destination.validator, input, root=root, refuse_unknown=declared_only)
        return input_json

    async def files(
        self,
        account_id: int,
        input: dict[str, Any],
        base_url: str | None = None,
        root: str = "input",
    ) -> dict[str, Any]:
        """Refuse file references (``/v1/files/{id}`` URLs) to anything but the account's own
        live uploads, naming each field under ``root``. Returns the input as a runner gets it:
        each reference a signed delivery URL under ``base_url``."""
        if self.stored_files is None:
            return input
        linked, errors = await self.stored_files.input_links(account_id, input, base_url)
        if errors:
            raise RefusedInput(
                [FieldError(root + e.field.removeprefix("input"), e.message) for e in errors]
            )
        return linked


def new_prediction(
    account: AccountInfo,
    destination: Destination,
    input: dict[str, Any],
    input_json: bytes,
    *,
    webhook: str | None = None,
    webhook_events_filter: list[str] | None = None,
    deadline: datetime | None = None,
    priority: Priority | None = None,
    request_id: str | None = None,
    source: str = "api",
    graph: dict[str, Any] | None = None,
) -> NewPrediction:
    """The prediction an admitted request makes, under a new id (a training when the
    destination trains into a model)."""
    return NewPrediction(
        id=new_prediction_id(),
        account_id=account.id,
        model=destination.version.model,
        version_id=destination.version.id,
        deployment_id=destination.deployment_id,
        deployment=destination.deployment,
        input=input,
        input_json=input_json,
        webhook=webhook,
        webhook_events_filter=webhook_events_filter,
        target=destination.target.name,
        deadline=deadline,
        priority=priority.value if priority is not None else None,
        request_id=request_id,
        kind="training" if destination.trains_into is not None else "prediction",
        destination=destination.trains_into,
        source=source,
        graph=graph,
    )
