"""The image, run with podman: verify inside it, a sidecar reached from the host through
``acp-bridge connect`` with a token, the state volume across containers, ``podman stop``.

Skipped unless ``ACP_BRIDGE_CONTAINER_TESTS=1``: ``scripts/container-test`` builds the image
(``ACP_BRIDGE_IMAGE``) and sets that. The sidecar runs the fake agent (mounted read-only),
which records every line it receives in a directory shared with the host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from sidecar import INITIALIZE, open_connect, system_prompt

pytestmark = [
    pytest.mark.container,
    pytest.mark.skipif(
        os.environ.get("ACP_BRIDGE_CONTAINER_TESTS") != "1",
        reason="container tests run through scripts/container-test",
    ),
]

IMAGE = os.environ.get("ACP_BRIDGE_IMAGE", "localhost/acp-bridge:test")
HOST_CA = os.environ.get("ACP_BRIDGE_HOST_CA", "")
FAKE_AGENT = Path(__file__).parent.parent / "fake_agent.py"
NATIVE = json.dumps({"sessionCapabilities": {"systemPrompt": {}}})
TOKEN = "sidecar-t0ken-" + uuid.uuid4().hex
STATE = "/home/node/.local/state"


def podman(*args: str, timeout: float = 60, check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
    return done.stdout


def ca_args() -> list[str]:
    """The host's CA bundle for npm behind a TLS-intercepting proxy, at a path of its own."""
    if not HOST_CA:
        return []
    return ["-v", f"{HOST_CA}:/run/host-ca.crt:ro", "-e", "NODE_EXTRA_CA_CERTS=/run/host-ca.crt"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Sidecar:
    """One ``serve`` container in front of the fake agent; ``shared`` is its record dir."""

    name: str
    port: int
    shared: Path

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def received(self) -> list[bytes]:
        path = self.shared / "agent-received"
        return path.read_bytes().splitlines() if path.exists() else []

    def logs(self) -> str:
        done = subprocess.run(
            ["podman", "logs", self.name], capture_output=True, text=True, check=False
        )
        return done.stdout + done.stderr


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Containers and volumes to remove, whatever the test did."""
    created: list[str] = []
    yield created
    for name in created:
        podman("rm", "-fv", "--time", "0", name, check=False)
        podman("volume", "rm", "-f", name, check=False)


def start_sidecar(name: str, volume: str, shared: Path, port: int) -> Sidecar:
    shared.mkdir(exist_ok=True)
    shared.chmod(0o777)  # the container's user is not the host's
    agent = ["python3", "/opt/fake/fake_agent.py", "--caps", NATIVE]
    agent += ["--record", "/shared/agent-received", "--pidfile", "/shared/agent.pid"]
    podman(
        "run", "-d", "--name", name,
        "-p", f"127.0.0.1:{port}:7000",
        "-e", f"ACP_BRIDGE_TOKEN={TOKEN}",
        "-v", f"{volume}:{STATE}",
        "-v", f"{FAKE_AGENT}:/opt/fake/fake_agent.py:ro",
        "-v", f"{shared}:/shared",
        IMAGE, "serve", "--log-level", "info", "--listen", "tcp://0.0.0.0:7000", "--", *agent,
    )  # fmt: skip
    sidecar = Sidecar(name, port, shared)
    deadline = time.monotonic() + 30
    while "listening on" not in sidecar.logs():
        assert time.monotonic() < deadline, sidecar.logs()
        time.sleep(0.1)
    return sidecar


def host_processes(marker: str) -> list[str]:
    """Command lines on the host that mention ``marker`` (container processes included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_verify_claude_inside_the_container(names: list[str]) -> None:
    name = f"acp-bridge-verify-{uuid.uuid4().hex[:8]}"
    names.append(name)
    done = subprocess.run(
        ["podman", "run", "--rm", "--name", name, *ca_args(), IMAGE, "verify", "--agent", "claude"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert " 0 failed" in done.stdout and "FAIL" not in done.stdout, done.stdout


def test_stdio_mode_runs_the_bridge_in_front_of_the_agent(names: list[str]) -> None:
    name = f"acp-bridge-stdio-{uuid.uuid4().hex[:8]}"
    names.append(name)
    requests = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INITIALIZE},
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/new",
            "params": {"cwd": "/", "mcpServers": [], "systemPrompt": system_prompt("STDIO")},
        },
    ]
    done = subprocess.run(
        ["podman", "run", "-i", "--rm", "--name", name,
         "-v", f"{FAKE_AGENT}:/opt/fake/fake_agent.py:ro",
         IMAGE, "--", "python3", "/opt/fake/fake_agent.py", "--caps", NATIVE],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # stdin closed: the bridge stopped the agent and the container ended on its own.
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [0, 1]
    assert answers[0]["result"]["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
    assert "sessionId" in answers[1]["result"]


async def test_sidecar_with_a_token_reached_through_connect(
    tmp_path: Path, names: list[str]
) -> None:
    name = f"acp-bridge-sidecar-{uuid.uuid4().hex[:8]}"
    names.append(name)
    sidecar = start_sidecar(name, name, tmp_path / "shared", free_port())
    with trio.fail_after(60):
        async with open_connect(sidecar.address, tmp_path / "editor", token=TOKEN) as editor:
            await editor.request(0, "initialize", INITIALIZE)
            result = (await editor.response_to(0))["result"]
            assert result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
            params = {"cwd": "/", "mcpServers": [], "systemPrompt": system_prompt("SIDECAR-1")}
            await editor.request(1, "session/new", params)
            assert "result" in await editor.response_to(1)
            # The agent's environment, read while it runs.
            pid = (sidecar.shared / "agent.pid").read_text().strip()
            environ = podman("exec", name, "cat", f"/proc/{pid}/environ")
            await editor.close_stdin()
            assert await editor.wait() == 0
        for label, token in (("wrong", "not-" + TOKEN), ("none", None)):
            async with open_connect(sidecar.address, tmp_path / label, token=token) as editor:
                await editor.request("init", "initialize", INITIALIZE)
                answer = await editor.response_to("init")
                assert answer["error"]["code"] == -32000, answer
                assert "token" in answer["error"]["message"]
                assert await editor.wait() == 1
    received = sidecar.received()
    session_new = [json.loads(line) for line in received if b'"session/new"' in line]
    assert session_new[0]["params"]["systemPrompt"] == system_prompt("SIDECAR-1")
    # Neither on the wire nor in the environment.
    assert not any(TOKEN.encode() in line for line in received)
    assert "ACP_BRIDGE_TOKEN" not in environ and TOKEN not in environ
    assert sum(b'"initialize"' in line for line in received) == 1  # refused ones start none


async def test_state_volume_outlives_the_container_and_stop_is_quick(
    tmp_path: Path, names: list[str]
) -> None:
    volume = f"acp-bridge-state-{uuid.uuid4().hex[:8]}"
    first, second = f"{volume}-a", f"{volume}-b"
    names.extend([first, second, volume])
    shared = tmp_path / "shared"
    port = free_port()
    sidecar = start_sidecar(first, volume, shared, port)
    with trio.fail_after(60):
        async with open_connect(sidecar.address, tmp_path / "editor-1", token=TOKEN) as editor:
            await editor.request(0, "initialize", INITIALIZE)
            await editor.response_to(0)
            params = {"cwd": "/", "mcpServers": [], "systemPrompt": system_prompt("KEPT")}
            await editor.request(1, "session/new", params)
            session_id = (await editor.response_to(1))["result"]["sessionId"]
            # Stop the container while the agent runs and the editor is connected.
            assert host_processes("/opt/fake/fake_agent.py")
            start = time.monotonic()
            await trio.to_thread.run_sync(podman, "stop", first)
            stop_seconds = time.monotonic() - start
            # connect leaves when the sidecar closes, and says the sidecar went away while
            # the editor was still connected (exit 1), as an agent that exits on its own.
            assert await editor.wait() == 1
    print(f"podman stop: {stop_seconds:.2f}s")
    assert stop_seconds < 5
    assert podman("inspect", "--format", "{{.State.Status}}", first).strip() == "exited"
    assert host_processes("/opt/fake/fake_agent.py") == []
    assert host_processes("tcp://0.0.0.0:7000") == []

    podman("rm", first)
    (shared / "agent-received").unlink()
    sidecar = start_sidecar(second, volume, shared, port)
    with trio.fail_after(60):
        async with open_connect(sidecar.address, tmp_path / "editor-2", token=TOKEN) as editor:
            await editor.request(0, "initialize", INITIALIZE)
            await editor.response_to(0)
            load = {"sessionId": session_id, "cwd": "/", "mcpServers": []}
            await editor.request(1, "session/load", load)
            assert "result" in await editor.response_to(1)
            await editor.close_stdin()
            assert await editor.wait() == 0
    loads = [json.loads(line) for line in sidecar.received() if b'"session/load"' in line]
    assert loads[0]["params"]["systemPrompt"] == system_prompt("KEPT")
