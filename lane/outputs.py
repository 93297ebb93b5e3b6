"""A run's output as the api answers and records it: each data URL above the files'
``inline_max`` moved into the file store (:mod:`files.data_urls`), as the durable path
does, before an answer or an ``output`` event leaves; smaller ones stay inline.

An output file that cannot be stored fails the run with the reason
(``output file could not be stored: ...``): the output is not answered without it.
"""

from __future__ import annotations

from files.data_urls import SAVE_ERRORS, DataUrlKeeper, DataUrls, unkept_reason
from protocol.documents import PredictionResponse
from protocol.values import RunnerStatus


class OutputNotKept(Exception):
    """An output file of the run could not be stored; the message is the run's error."""


class RunOutputs:
    """The output files of one run (none are moved without a store)."""

    def __init__(self, data_urls: DataUrls | None, account_id: int, prediction_id: str) -> None:
        self._keeper: DataUrlKeeper | None = (
            data_urls.keeper(account_id, prediction_id) if data_urls is not None else None
        )

    async def kept(self, snapshot: PredictionResponse) -> PredictionResponse:
        """``snapshot`` with its large data URLs replaced by their files' URLs. Raises
        :class:`OutputNotKept`."""
        if self._keeper is None or snapshot.output is None:
            return snapshot
        try:
            output = await self._keeper.keep(snapshot.output)
        except SAVE_ERRORS as error:
            raise OutputNotKept(unkept_reason(error)) from error
        if output is snapshot.output:
            return snapshot
        return snapshot.model_copy(update={"output": output})


def failed(snapshot: PredictionResponse, error: str) -> PredictionResponse:
    """``snapshot`` as the run that failed for ``error``: its output not kept."""
    return snapshot.model_copy(
        update={"status": RunnerStatus.FAILED, "output": None, "error": error}
    )
