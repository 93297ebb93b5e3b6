"""What kind of job a director runs, chosen once when it starts (``job_kind``): predictions,
or a trainer's trainings. Where the two differ in running an attempt, the kind says; the
attempt's handling asks it rather than testing the row's kind each time."""

from __future__ import annotations

import functools
from typing import Protocol

from sqlalchemy.engine import RowMapping

from director.outcomes import SuccessHook
from director.trainings import TrainingResults

#: Runs a training may start: one lost with its director is run again.
TRAINING_RUNS = 3


class JobKind(Protocol):
    def runs(self, max_attempts: int) -> int:
        """Runs a job may start, given its deployment's ``max_attempts``."""
        ...

    def runner_id(self, row: RowMapping) -> str | None:
        """The id the runner knows the run by; None: the prediction's own."""
        ...

    def on_success(self, row: RowMapping) -> SuccessHook | None:
        """What a succeeded run's output becomes before it is written."""
        ...


class Predictions:
    def runs(self, max_attempts: int) -> int:
        return max_attempts

    def runner_id(self, row: RowMapping) -> str | None:
        return None

    def on_success(self, row: RowMapping) -> SuccessHook | None:
        return None


class Trainings:
    def __init__(self, results: TrainingResults) -> None:
        self.results = results

    def runs(self, max_attempts: int) -> int:
        """A director's death costs a training one more run."""
        return max(max_attempts, TRAINING_RUNS)

    def runner_id(self, row: RowMapping) -> str | None:
        """A training's run is known to the trainer by its attempt: a stock Cog trainer keeps
        a dead director's run going, and would take a new run under the same id for that one
        (it merges a PUT of an id it runs), whose webhooks go to the dead director."""
        return f"{row['id']}-{row['attempt']}"

    def on_success(self, row: RowMapping) -> SuccessHook | None:
        """Its weights kept, its destination's new version made."""
        return functools.partial(self.results.publish, row)


PREDICTIONS = Predictions()
