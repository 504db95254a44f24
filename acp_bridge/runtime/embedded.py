"""A bridge running inside this process, with an ACP client attached over memory streams.

``check`` and ``verify`` use it: the same relay an editor talks to over stdio, without a
second Python process in between.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime.agents import Spawner, spawn_process
from acp_bridge.runtime.client import AcpClient, connect
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore


@dataclass
class EmbeddedBridge:
    client: AcpClient
    bridge: Bridge
    status: int | None = None


@asynccontextmanager
async def open_embedded_bridge(
    options: BridgeOptions,
    store: SessionStore,
    registry: AdapterRegistry | None = None,
    spawner: Spawner = spawn_process,
) -> AsyncIterator[EmbeddedBridge]:
    """Start the agent behind a bridge; on exit close the client side and wait for shutdown.
    ``spawner`` starts the agent processes (by default with the bridge's stderr)."""
    client_socket, bridge_socket = trio.socket.socketpair()
    client_stream, bridge_stream = (
        trio.SocketStream(client_socket),
        trio.SocketStream(bridge_socket),
    )
    lifecycle = Lifecycle.for_command(store, options.agent_argv)
    bridge = Bridge(
        options, bridge_stream, bridge_stream, lifecycle, registry=registry, spawner=spawner
    )
    await bridge.start_agent()  # outside the nursery, so a start failure is a plain error
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        embedded: EmbeddedBridge | None = None

        async def run() -> None:
            status = await bridge.run(watch_signals=False)
            if embedded is not None:
                embedded.status = status

        nursery.start_soon(run)
        async with connect(client_stream, client_stream) as client:
            embedded = EmbeddedBridge(client, bridge)
            try:
                yield embedded
            except Exception as exc:  # re-raised below as itself, not inside an ExceptionGroup
                failure = exc
            finally:
                with trio.CancelScope(shield=True):
                    await client_stream.aclose()
    if failure is not None:
        raise failure
