"""Settings of files (``CONDUIT_FILES_*``): where their bytes live, how big and how long."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from files.local import LocalStore
from files.quota import UploadQuota
from files.s3 import S3Store
from files.store import FileStore

MIB = 1024 * 1024


class FileSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_FILES_", extra="ignore", env_ignore_empty=True
    )

    #: ``local``: a directory on this host (one host, or a shared volume); ``s3``: a bucket.
    backend: Literal["local", "s3"] = "local"
    #: The ``local`` backend's directory.
    dir: Path = Path(".conduit/files")
    #: The ``s3`` backend's bucket.
    s3_bucket: str | None = None
    #: An S3-compatible server (MinIO, ...); unset = AWS S3 itself.
    s3_endpoint_url: str | None = None
    #: The bucket's region.
    s3_region: str = "us-east-1"
    #: Unset = the standard AWS credential chain (environment, profile, instance role).
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    #: Prepended to every object's key, to share a bucket (e.g. ``conduit/``).
    s3_prefix: str = ""
    #: Largest upload, and largest output file, in bytes.
    max_bytes: int = Field(100 * MIB, ge=1)
    #: Live uploads one account may hold (0: no limit); past it, 403 ``file_quota``. A
    #: gateway task's files are uploads too (``RESOURCE_EXHAUSTED`` past it).
    account_max_files: int = Field(10000, ge=0)
    #: Bytes one account's live uploads may take together (0: no limit); past it, 413
    #: ``file_quota`` and nothing kept.
    account_max_bytes: int = Field(10 * 1024 * MIB, ge=0)
    #: Uploads one account may make, shared by every api replica (counted in Redis):
    #: ``60req/min``, ``1/s``…; ``off``: no limit. Past it, 429 ``rate_limited`` with
    #: ``Retry-After``.
    upload_rate_limit: str = "60req/min"
    #: Uploads an account may make at once before the rate applies.
    upload_rate_burst: int = Field(10, ge=1)
    #: Seconds an upload is kept (its ``expires_at``).
    retention: int = Field(86400, ge=1)
    #: Seconds after a prediction ends that its output files and data (input, output, logs)
    #: are removed (``data_removed``); 0 keeps them.
    output_retention: int = Field(3600, ge=0)
    #: Seconds between passes of the retention sweep (``files.retention``), which
    #: every api replica runs.
    sweep_interval: float = Field(60, gt=0)
    #: An output data URL of at most this many decoded bytes stays inline; larger ones are
    #: stored and replaced by their URL.
    inline_max: int = Field(262144, ge=0)
    #: Seconds a signed input URL handed to a runner stays valid.
    input_link_ttl: int = Field(86400, ge=1)
    #: The api's base URL as runners reach it, for the input files they fetch (inside a
    #: cluster it often differs from ``CONDUIT_PUBLIC_URL``, which clients use); unset = that.
    internal_url: str | None = None

    @property
    def quota(self) -> UploadQuota:
        return UploadQuota(self.account_max_files, self.account_max_bytes)

    def store(self) -> FileStore:
        """The configured backend (``ValueError`` when ``s3`` lacks its bucket)."""
        if self.backend == "local":
            return LocalStore(self.dir)
        if not self.s3_bucket:
            raise ValueError("CONDUIT_FILES_S3_BUCKET is required with the s3 backend")
        return S3Store(
            bucket=self.s3_bucket,
            endpoint_url=self.s3_endpoint_url,
            region=self.s3_region,
            access_key_id=_reveal(self.s3_access_key_id),
            secret_access_key=_reveal(self.s3_secret_access_key),
            prefix=self.s3_prefix,
        )


def _reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None
