"""``acp-bridge check``: one ``initialize`` through an in-process bridge, and its report.

This module owns what the report says: what the agent offers natively, which adapter was
chosen and why, and what the bridge then advertises, in words (``--json`` gives the raw
answers). While it runs, the agent's own stderr reaches the terminal line by line, each
line labelled as the agent's, so it is not taken for the bridge's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

import trio

from acp_bridge import __version__
from acp_bridge.core import capabilities
from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.agents import AgentHandle
from acp_bridge.runtime.embedded import open_embedded_bridge
from acp_bridge.runtime.relay import BridgeOptions
from acp_bridge.state.store import SessionStore
from acp_bridge.supervision.agent_process import AgentProcess
from acp_bridge.wire.jsonrpc import JsonObject

CHECK_TIMEOUT: Final = 60.0
AGENT_STDERR_LABEL: Final = "agent stderr: "
# After the agents have stopped, how long a descendant that escaped their process group
# may still hold their stderr open before the report is printed without its last lines.
STDERR_DRAIN: Final = 2.0
NATIVE: Final = "native"
FALLBACK: Final = "first-turn"
PASSTHROUGH: Final = "passthrough"


class LabelledStderr:
    """The agents' stderr during a check: through a pipe, onto the bridge's stderr with
    each line labelled; the bridge's own log lines stay as they are."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        self._scope = trio.CancelScope()

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
    ) -> AgentHandle:
        return await AgentProcess.start(
            argv, extra_env=env, private_files=private_files, stderr=self._write_fd
        )

    async def copy(self) -> None:
        """Copy until every writer has closed the pipe, or the drain time after
        :meth:`close` has passed."""
        pending = b""
        with self._scope, contextlib.suppress(OSError, trio.BrokenResourceError):
            async with trio.lowlevel.FdStream(self._read_fd) as pipe:
                async for chunk in pipe:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        self._write(line)
        if pending:
            self._write(pending)

    def close(self) -> None:
        """The agents are gone: stop writing, and end the copy once it has read the rest."""
        with contextlib.suppress(OSError):
            os.close(self._write_fd)
        self._scope.deadline = trio.current_time() + STDERR_DRAIN

    @staticmethod
    def _write(line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        sys.stderr.write(f"{AGENT_STDERR_LABEL}{text}\n")
        sys.stderr.flush()


async def run_check(
    options: BridgeOptions, registry: AdapterRegistry, adapter_source: str = ""
) -> dict[str, Any]:
    """Initialize the agent through an in-process bridge; report both sides of it.

    ``adapter_source`` says where a configured adapter was named (empty: chosen
    automatically)."""
    stderr = LabelledStderr()
    store = SessionStore(":memory:")
    failure: Exception | None = None
    report: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stderr.copy)
        try:
            report = await _initialize(options, registry, store, stderr)
        except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
            failure = exc
        finally:
            stderr.close()
            store.close()
    if failure is not None:
        raise failure
    report["adapter_reason"] = adapter_reason(report, adapter_source)
    return report


async def _initialize(
    options: BridgeOptions, registry: AdapterRegistry, store: SessionStore, stderr: LabelledStderr
) -> dict[str, Any]:
    with trio.fail_after(CHECK_TIMEOUT):
        async with open_embedded_bridge(options, store, registry, spawner=stderr.spawn) as embedded:
            advertised = await embedded.client.request(
                "initialize",
                {
                    "protocolVersion": 1,
                    "clientCapabilities": {},
                    "clientInfo": {"name": "acp-bridge check", "version": __version__},
                },
            )
            native = embedded.bridge.primary.initialize_result or {}
            adapter = embedded.bridge.adapter
    return {
        "agent": native.get("agentInfo") or native.get("info"),
        "native": capabilities.session_capabilities(native).get("systemPrompt"),
        "adapter": adapter.name if adapter else None,
        "delivery": adapter.description if adapter else "",
        "advertised": capabilities.session_capabilities(advertised).get("systemPrompt"),
        "initialize": {"agent": native, "bridge": advertised},
    }


def describe_modes(capability: object) -> str:
    """A ``systemPrompt`` capability in words: ``append only``, ``append and override``."""
    if not isinstance(capability, dict):
        return ""
    modes = capability.get("mode")
    names = ["append"]
    if isinstance(modes, dict):
        names += [name for name, value in modes.items() if isinstance(value, dict)]
    if len(names) == 1:
        return "append only"
    return f"{', '.join(names[:-1])} and {names[-1]}"


def adapter_reason(report: JsonObject, source: str) -> str:
    """Why the report's adapter is the one in use."""
    if source:
        return source
    agent = report.get("agent")
    name = agent.get("name") if isinstance(agent, dict) else None
    if report.get("adapter") == NATIVE:
        return "the agent advertises systemPrompt and no other adapter recognises it"
    if report.get("adapter") == FALLBACK:
        return "no adapter recognises the agent and it does not advertise systemPrompt"
    return f"it recognises the agent ({name!r})" if name else "it recognises the agent"


def report_lines(report: JsonObject) -> list[str]:
    """The report as the terminal shows it."""
    agent = report.get("agent")
    agent = agent if isinstance(agent, dict) else {}
    native = describe_modes(report.get("native"))
    if native:
        native += " (the agent advertises systemPrompt)"
    else:
        native = "nothing (the agent does not advertise systemPrompt)"
    advertised = describe_modes(report.get("advertised")) or "nothing"
    if report.get("adapter") == PASSTHROUGH:
        advertised += " (the agent's own answer, relayed as it came)"
    rows = [
        ("agent", f"{agent.get('name', '?')} {agent.get('version', '')}".rstrip()),
        ("natively", native),
        ("adapter", f"{report.get('adapter')}, {_because(str(report.get('adapter_reason')))}"),
        ("delivery", str(report.get("delivery") or "")),
        ("advertised", advertised),
    ]
    return [f"{label + ':':<12}{text}".rstrip() for label, text in rows]


def _because(reason: str) -> str:
    """A reason joined to the adapter's name: ``because …`` unless it says how it came."""
    return reason if reason.startswith(("given", "named", "set")) else f"because {reason}"
