"""The peer route: a block another cluster publishes, run there through its gateway."""

from __future__ import annotations

import time
from typing import Any

from catalog.records import AccountInfo
from gateway.peers import PeerAnswer, RemoteBlock
from gateway.resources import GatewayResources
from gateway.task import InputFile


class PeerRoute:
    def __init__(self, resources: GatewayResources) -> None:
        self.resources = resources

    async def run(
        self,
        account: AccountInfo,
        remote: RemoteBlock,
        data: dict[str, Any],
        deadline: float | None,
        files: list[InputFile] | None = None,
        frame_ptr: bytes = b"",
    ) -> PeerAnswer:
        """Run ``data`` (with ``files``, and the task's frame) on another cluster's block."""
        peers = self.resources.peers
        assert peers is not None  # a remote block is only found with a cluster id
        if deadline is None:
            deadline = time.monotonic() + self.resources.settings.default_deadline
        return await peers.infer(remote, account, data, deadline, files, frame_ptr)
