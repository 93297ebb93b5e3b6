"""The synchronous lane's settings, from ``CONDUIT_API_LANE_*`` and ``CONDUIT_RUNNER_TOKEN``.

The lane runs inside each api process, so its variables keep the api's prefix.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from lane.core_records import LaneConfig


class LaneSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_API_", extra="ignore", env_ignore_empty=True
    )

    #: The runners' shared secret (their ``CONDUIT_RUNNER_TOKEN``), sent when the lane calls a
    #: runner; the fleet registry never holds it.
    runner_token: str | None = Field(
        None,
        repr=False,
        validation_alias=AliasChoices("CONDUIT_RUNNER_TOKEN", "CONDUIT_API_RUNNER_TOKEN"),
    )
    #: Requests a deployment may queue per permit of its runners (this replica's share).
    lane_queue_factor: int = Field(10, ge=1)
    #: Seconds a ``/run`` request may wait in the queue before it is refused (429).
    lane_queue_ttl: float = Field(30.0, gt=0)
    #: Seconds between reads of the fleet registry.
    lane_fleet_interval: float = Field(1.0, gt=0)
    #: Seconds between full re-reads of the runners by the lane, even unchanged: clears a
    #: runner marked full after its refusal (at most 5 s is the design's bound).
    lane_refresh: float = Field(5.0, gt=0, le=5)
    #: Seconds between this replica's heartbeats in the lane's membership.
    lane_member_heartbeat: float = Field(1.0, gt=0)
    #: Seconds after its last heartbeat that a replica stops counting (its share of every
    #: runner's permits goes to the others).
    lane_member_ttl: float = Field(3.0, gt=0)

    def config(self) -> LaneConfig:
        """The core's part of them."""
        return LaneConfig(queue_factor=self.lane_queue_factor, queue_ttl_s=self.lane_queue_ttl)
