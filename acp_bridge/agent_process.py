"""Supervision of one agent process: spawn in its own process group, orderly shutdown.

The agent gets the bridge's full environment plus configured extras (editors pass API
keys through the environment, so nothing is trimmed). Its stderr is the bridge's stderr.
Shutdown closes stdin, waits a grace period, then signals the whole process group
(SIGTERM, then SIGKILL), so wrappers such as ``npx`` cannot leave their child behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final

import trio

log = logging.getLogger("acp_bridge.agent")

# How often to look whether a signalled process group has emptied.
_GROUP_POLL: Final = 0.02


class AgentStartError(Exception):
    """The agent command could not be started."""


class AgentProcess:
    """A running agent. Use :meth:`start`, read ``stdout``, write ``stdin``, then :meth:`stop`."""

    def __init__(self, process: trio.Process, argv: Sequence[str]) -> None:
        self.process = process
        self.argv = list(argv)
        assert process.stdin is not None and process.stdout is not None
        self.stdin: trio.abc.SendStream = process.stdin
        self.stdout: trio.abc.ReceiveStream = process.stdout
        self.pgid = process.pid  # start_new_session makes the child its group leader
        self._stdin_closed = False
        self.terminated_by_bridge = False

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        extra_env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AgentProcess:
        env = {**os.environ, **(extra_env or {})}
        try:
            process = await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise AgentStartError(f"cannot start agent {argv[0]!r}: {exc.strerror or exc}") from exc
        log.debug("started agent pid %d: %s", process.pid, " ".join(argv))
        return cls(process, argv)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    async def close_stdin(self) -> None:
        if not self._stdin_closed:
            self._stdin_closed = True
            gone = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
            with trio.move_on_after(1), contextlib.suppress(*gone):
                await self.stdin.aclose()

    def signal_group(self, signum: int) -> bool:
        """Signal every process in the agent's group; False when the group is empty."""
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    def group_alive(self) -> bool:
        return self.signal_group(0)

    async def _wait_group(self, timeout: float) -> bool:
        """Wait until the agent and everything in its group has gone; True if it did."""
        with trio.move_on_after(timeout) as scope:
            await self.process.wait()
            while self.group_alive():
                await trio.sleep(_GROUP_POLL)
        return not scope.cancelled_caught

    async def stop(self, grace: float) -> int:
        """Close stdin, wait, SIGTERM the group, wait, SIGKILL the group. Returns the status.

        Shielded: shutdown must finish even when the caller is being cancelled.
        """
        with trio.CancelScope(shield=True):
            await self.close_stdin()
            if not await self._wait_group(grace):
                log.debug("agent pid %d still running after EOF; sending SIGTERM", self.pid)
                self.terminated_by_bridge = self.process.returncode is None
                self.signal_group(signal.SIGTERM)
                if not await self._wait_group(grace):
                    log.warning("agent pid %d ignored SIGTERM; sending SIGKILL", self.pid)
                    self.signal_group(signal.SIGKILL)
                    await self.process.wait()
                    # Give the kernel a moment to reap the rest of the group.
                    await self._wait_group(grace)
            status = await self.process.wait()
        return status
