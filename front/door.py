"""The front door one process opens once and every entry of it goes through."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.cache import Catalog
from files.service import Files
from front.admission import Admission
from front.destinations import Resolver
from front.durable import Durable
from front.settings import AdmissionSettings
from tracker.rate_limits import CreateRateLimit


@dataclass(frozen=True, slots=True)
class FrontDoor:
    """Resolution, admission and the durable path of one process (an api replica, a gateway)."""

    resolver: Resolver
    admission: Admission
    durable: Durable

    @classmethod
    def of(
        cls,
        catalog: Catalog,
        durable: Durable,
        files: Files | None,
        create_limit: CreateRateLimit | None,
        settings: AdmissionSettings | None = None,
    ) -> FrontDoor:
        admission = Admission(settings or AdmissionSettings(), files, create_limit)
        return cls(Resolver(catalog), admission, durable)
