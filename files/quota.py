"""Each account's room for uploads: how many live uploads it may hold
(``CONDUIT_FILES_ACCOUNT_MAX_FILES``) and how many bytes they may take together
(``CONDUIT_FILES_ACCOUNT_MAX_BYTES``). Outputs and weights are the platform's own writes and
do not count; a deleted or expired upload stops counting at once.

An upload is checked twice: before its body is read (an account already at a quota is refused
without a byte stored, and the store is told to stop at the bytes still free), and when its row
is written, under a per-account lock, so that uploads running side by side cannot together pass
a quota; one that would is removed again.
"""

from __future__ import annotations

from dataclasses import dataclass

from files.store import TooLarge


@dataclass(frozen=True, slots=True)
class Usage:
    """An account's live uploads: how many, and their bytes."""

    files: int
    bytes: int


class QuotaExceeded(TooLarge):
    """The upload would take the account past a quota (``quota``: ``files`` or ``bytes``);
    nothing was kept. A ``TooLarge``: whoever refuses an oversize file refuses this too."""

    def __init__(self, quota: str, limit: int, usage: Usage) -> None:
        TooLarge.__init__(self, limit)
        self.quota = quota
        self.limit = limit
        self.usage = usage
        if quota == "files":
            self.args = (
                f"the account holds {usage.files} files, its quota "
                f"(CONDUIT_FILES_ACCOUNT_MAX_FILES is {limit}); delete some or let them expire",
            )
        else:
            self.args = (
                f"the account's files would pass its quota of {limit} bytes "
                f"(CONDUIT_FILES_ACCOUNT_MAX_BYTES; {usage.bytes} bytes held); delete some or "
                "let them expire",
            )


@dataclass(frozen=True, slots=True)
class UploadQuota:
    """The quotas; 0 turns one off."""

    max_files: int
    max_bytes: int

    def room(self, usage: Usage, file_limit: int) -> int:
        """Bytes one more upload may bring (at most ``file_limit``); QuotaExceeded when the
        account has no room left at all."""
        if self.max_files and usage.files >= self.max_files:
            raise QuotaExceeded("files", self.max_files, usage)
        if not self.max_bytes:
            return file_limit
        free = self.max_bytes - usage.bytes
        if free <= 0:
            raise QuotaExceeded("bytes", self.max_bytes, usage)
        return min(file_limit, free)

    def admit(self, usage: Usage, size: int) -> None:
        """QuotaExceeded unless an upload of ``size`` bytes fits beside ``usage``."""
        if self.max_files and usage.files + 1 > self.max_files:
            raise QuotaExceeded("files", self.max_files, usage)
        if self.max_bytes and usage.bytes + size > self.max_bytes:
            raise QuotaExceeded("bytes", self.max_bytes, usage)
