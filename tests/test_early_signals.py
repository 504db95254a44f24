"""SIGTERM and SIGHUP from the moment an agent is started early until the runtime listens.

A signal in that stretch once took the operating system's default action: the bridge died
by it (status -15 instead of 143), found by a start-up test that failed now and then under
load when its SIGTERM landed between the early ``initialize`` exchange and the trio run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from memory_agent import MemorySpawner

from acp_bridge.registry import AdapterRegistry
from acp_bridge.runtime import early_signals
from acp_bridge.runtime.relay import Bridge, BridgeOptions
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import SessionStore

INITIALIZE = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'

# The bridge's own command, with every change of a SIGTERM/SIGHUP disposition and every
# process start noted on stderr, in order.
TRACED_BRIDGE = """
import os, signal, subprocess, sys

def note(text):
    os.write(2, ("@@ " + text + "\\n").encode())

set_handler = signal.signal

def traced(signum, handler):
    if signum in (signal.SIGTERM, signal.SIGHUP):
        note(f"{int(signum)} {'default' if handler is signal.SIG_DFL else 'handled'}")
    return set_handler(signum, handler)

signal.signal = traced
start = subprocess.Popen.__init__

def spawn(self, *args, **kwargs):
    note("spawn")
    start(self, *args, **kwargs)

subprocess.Popen.__init__ = spawn
sys.argv = ["acp-bridge", *sys.argv[1:]]
from acp_bridge.__main__ import main
main()
"""


def test_no_signal_finds_the_default_action_once_an_agent_is_started_early(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    pidfile = tmp_path / "agent.pid"
    agent = f"import os, sys\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\nsys.stdin.read()"
    process = subprocess.Popen(
        [sys.executable, "-c", TRACED_BRIDGE, "--state", ":memory:", "--",
         sys.executable, "-c", agent],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=bridge_env,
    )  # fmt: skip
    try:
        assert process.stdin is not None
        process.stdin.write(INITIALIZE)
        process.stdin.flush()
        deadline = time.monotonic() + 10
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # past the early exchange, into the runtime
        _, stderr = process.communicate(b"", timeout=20)
    finally:
        if process.poll() is None:  # a failed run leaves no bridge behind
            process.kill()
            process.wait()
    notes = [line[3:] for line in stderr.decode().splitlines() if line.startswith("@@ ")]
    assert "spawn" in notes, stderr.decode()
    first_spawn = notes.index("spawn")
    handled_before = {note for note in notes[:first_spawn] if note.endswith("handled")}
    # A signal the bridge inherits ignored (SIGHUP under nohup) stays ignored; each of the
    # others gets its handler before the agent is spawned.
    not_ignored = [
        s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN
    ]
    assert handled_before == {f"{int(s)} handled" for s in not_ignored}, notes
    assert [note for note in notes if note.endswith("default")] == [], notes


@pytest.fixture
def early_handlers() -> Iterator[None]:
    """The early handlers installed in this process for the test, and taken out after."""
    previous = {signum: signal.getsignal(signum) for signum in early_signals.SIGNALS}
    for signum in early_signals.SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    early_signals.install()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        state = early_signals._STATE  # back to where a new process starts
        state.installed, state.holding, state.pending = False, False, None


@pytest.mark.usefixtures("early_handlers")
def test_before_the_run_a_signal_exits_with_128_plus_its_number() -> None:
    with pytest.raises(SystemExit) as exited:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(1)  # the handler runs at the next bytecode, well before this ends
    assert exited.value.code == 128 + signal.SIGHUP


@pytest.mark.usefixtures("early_handlers")
def test_a_signal_while_the_run_starts_is_held_for_the_runtime_which_stops_the_agent() -> None:
    spawned: list[MemorySpawner] = []

    async def main() -> int:
        store = SessionStore(":memory:")
        client_send, client_receive = trio.testing.memory_stream_one_way_pair()
        out_send, out_receive = trio.testing.memory_stream_one_way_pair()
        async with trio.open_nursery() as nursery:
            spawner = MemorySpawner(nursery, name="memory-agent")
            spawned.append(spawner)
            bridge = Bridge(
                BridgeOptions(agent_argv=["memory-agent"], shutdown_grace=0.5),
                client_receive,
                out_send,
                Lifecycle(store, "memory-agent"),
                registry=AdapterRegistry(()),
                spawner=spawner,
            )
            with trio.fail_after(10):
                status = await bridge.run()
            await client_send.aclose()
            await out_receive.aclose()
        store.close()
        return status

    with early_signals.held():
        os.kill(os.getpid(), signal.SIGTERM)  # before trio's receiver is open
        status = trio.run(main)
    assert status == 128 + signal.SIGTERM
    [agent] = spawned[0].agents
    assert agent.returncode is not None


@pytest.mark.usefixtures("early_handlers")
def test_a_held_signal_no_runtime_took_ends_the_block() -> None:
    with pytest.raises(SystemExit) as exited, early_signals.held():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert exited.value.code == 128 + signal.SIGTERM
    assert early_signals.take() is None
