"""Webhook and event settings shared by the api and directors (``CONDUIT_WEBHOOK_*``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.ssrf import parse_cidrs
from tracker.webhooks import DEFAULT_SCHEDULE, WebhookPolicy


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_WEBHOOK_", extra="ignore", env_ignore_empty=True
    )

    #: Comma-separated CIDRs webhooks may reach although internal (e.g. ``127.0.0.0/8``).
    allow_cidrs: str = ""
    #: Comma-separated seconds before each retry of a ``completed`` webhook.
    retry_schedule: str = ",".join(f"{s:g}" for s in DEFAULT_SCHEDULE)
    #: Each retry's wait is stretched by up to this fraction, at random (jitter only adds).
    retry_jitter: float = Field(0.2, ge=0, lt=1)
    #: Seconds for one attempt, whatever the receiver does (answer, body, silence).
    timeout: float = Field(10.0, gt=0)
    #: Seconds to establish a connection to a receiver (part of ``timeout``).
    connect_timeout: float = Field(2.0, gt=0)
    #: Deliveries in flight per process, for ``completed`` and again for intermediate events.
    concurrency: int = Field(16, ge=1)
    #: Of those, deliveries in flight for one account: its slow receivers leave the rest to
    #: other accounts. Deliveries over the cap wait their turn; none is dropped.
    per_account: int = Field(8, ge=1)
    #: Minimum seconds between intermediate webhooks of one prediction.
    intermediate_interval: float = 0.5
    #: Longest pause between looks for due webhooks. A new terminal webhook is sent at once by
    #: the process that wrote it, and a retry when its backoff ends; the look is for a webhook
    #: whose writer died before sending it.
    poll_interval: float = 1.0

    def policy(self, public_url: str) -> WebhookPolicy:
        return WebhookPolicy(
            allow=parse_cidrs(self.allow_cidrs),
            schedule=tuple(float(s) for s in self.retry_schedule.split(",") if s.strip()),
            jitter=self.retry_jitter,
            timeout=self.timeout,
            connect_timeout=min(self.connect_timeout, self.timeout),
            concurrency=self.concurrency,
            per_account=min(self.per_account, self.concurrency),
            intermediate_interval=self.intermediate_interval,
            poll_interval=self.poll_interval,
            public_url=public_url.rstrip("/"),
        )
