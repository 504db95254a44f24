"""claude-agent-acp through the bridge, end to end, against the embedded model endpoint.

Three real releases, installed from npm into the shared agent cache by ``tests/agents.py``:

* ``@zed-industries/claude-agent-acp@0.23.1``: the ``claude`` adapter, no prompt pinning;
* ``@agentclientprotocol/claude-agent-acp@0.91.0``: the newest release without native
  ``systemPrompt``; the ``claude`` adapter with ``snapshot: false``;
* ``@agentclientprotocol/claude-agent-acp@0.101.0``: advertises ``systemPrompt`` itself
  but pins a session's first prompt, so the automatic choice is the ``claude`` adapter
  (``snapshot: false``), not ``native``.

Each runs behind the real command line (``python -m acp_bridge --state FILE -- node …``)
with the adapter chosen automatically, and every assertion is on the ``system`` field the
model received for a ``session/prompt``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agents
import pytest
import trio
from conftest import run_verify

from acp_bridge.commands.verify import DefaultPrompt
from acp_bridge.model_endpoint import ModelEndpoint, open_model_endpoint
from acp_bridge.runtime.client import AcpClient, ClientRequestError, spawn_bridge
from acp_bridge.wire.framing import DEFAULT_STREAM_AFTER as STREAM_AFTER

pytestmark = pytest.mark.e2e

# The Claude Code preset differs between CLI versions (even its identity line), so it is
# recognised by the lines of a session that got no prompt; an override leaves a few.
KEPT_AT_LEAST = 0.7
GONE_AT_MOST = 0.3
TIMEOUT = 120.0

VERSIONS = {
    "0.23.1": (agents.CLAUDE_LEGACY, "claude"),
    "0.91.0": (agents.CLAUDE_PRE_NATIVE, "claude"),
    # Advertises systemPrompt, but only the claude adapter passes verify with it.
    "0.101.0": (agents.CLAUDE_NATIVE, "claude"),
}


def text_prompt(mode: str, text: str) -> dict[str, Any]:
    return {"mode": mode, "content": [{"type": "text", "text": text}]}


@dataclass
class ClaudeRig:
    """One claude-agent-acp release, an isolated HOME, a bridge state file and the
    endpoint the agent talks to; it outlives bridge restarts."""

    command: list[str]
    adapter: str
    root: Path
    endpoint: ModelEndpoint

    @property
    def cwd(self) -> str:
        return str(self.root / "project")

    @property
    def state(self) -> str:
        return str(self.root / "bridge-state.sqlite3")

    def env(self) -> dict[str, str]:
        env = agents.clean_agent_env(os.environ)
        env.update(
            HOME=str(self.root / "home"),
            ANTHROPIC_BASE_URL=self.endpoint.url,
            ANTHROPIC_API_KEY="sk-ant-acp-bridge-test",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            env.pop(name, None)
        return env

    @asynccontextmanager
    async def bridge(
        self, on_omitted: str = "keep", adapter: str | None = None
    ) -> AsyncIterator[Bridged]:
        chosen = ["--adapter", adapter] if adapter else []
        argv = [
            sys.executable,
            "-m",
            "acp_bridge",
            "--state",
            self.state,
            "--on-omitted",
            on_omitted,
            *chosen,
            "--",
            *self.command,
        ]
        async with spawn_bridge(argv, env=self.env()) as (client, _process):
            with trio.fail_after(TIMEOUT):
                result = await client.request(
                    "initialize", {"protocolVersion": 1, "clientCapabilities": {}}
                )
            meta = result["agentCapabilities"]["_meta"]["acp-bridge"]
            assert meta["adapter"] == (adapter or self.adapter)
            yield Bridged(self, client)


@dataclass
class Bridged:
    rig: ClaudeRig
    client: AcpClient

    def _params(self, session_id: str | None, prompt: dict[str, Any] | None) -> dict[str, Any]:
        params: dict[str, Any] = {"cwd": self.rig.cwd, "mcpServers": []}
        if session_id is not None:
            params["sessionId"] = session_id
        if prompt is not None:
            params["systemPrompt"] = prompt
        return params

    async def new(self, prompt: dict[str, Any] | None) -> str:
        with trio.fail_after(TIMEOUT):
            result = await self.client.request("session/new", self._params(None, prompt))
        return str(result["sessionId"])

    async def reopen(self, method: str, session_id: str, prompt: dict[str, Any] | None) -> str:
        with trio.fail_after(TIMEOUT):
            result = await self.client.request(method, self._params(session_id, prompt))
        if method == "session/fork":
            return str(result["sessionId"])
        return session_id

    async def close(self, session_id: str) -> None:
        with trio.fail_after(TIMEOUT):
            await self.client.request("session/close", {"sessionId": session_id})

    async def system(self, session_id: str) -> str:
        """Prompt the session once; the ``system`` text of the model call it caused."""
        token = f"turn-{len(self.rig.endpoint.requests)}-{session_id[:8]}"
        with trio.fail_after(TIMEOUT):
            await self.client.request(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": token}]},
            )
            while True:
                calls = self.rig.endpoint.main_requests("anthropic")
                for call in calls:
                    if any(token in text for text in call.user_texts()):
                        return call.system_text()
                await self.rig.endpoint.wait_for_requests(len(calls) + 1, TIMEOUT)


@pytest.fixture(params=list(VERSIONS), ids=lambda v: f"claude-agent-acp@{v}")
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ClaudeRig]:
    (package, version), adapter = VERSIONS[request.param]
    command = await trio.to_thread.run_sync(agents.claude_agent_command, package, version)
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    async with open_model_endpoint() as endpoint:
        yield ClaudeRig(command, adapter, tmp_path, endpoint)


def checker(mode: str, default: DefaultPrompt) -> Any:
    def check(system: str, marker: str, *gone: str) -> None:
        assert marker in system
        share = default.share_in(system)
        if mode == "append":
            assert share >= KEPT_AT_LEAST, "append must keep the Claude Code preset"
        else:
            assert share <= GONE_AT_MOST, "override must replace the Claude Code preset"
        for old in gone:
            assert old not in system

    return check


async def test_append_and_override_reach_the_model_on_session_new(rig: ClaudeRig) -> None:
    async with rig.bridge() as bridged:
        default = DefaultPrompt.from_text(await bridged.system(await bridged.new(None)))
        assert default.lines
        appended = await bridged.new(text_prompt("append", "MARKER-NEW-APPEND"))
        checker("append", default)(await bridged.system(appended), "MARKER-NEW-APPEND")
        replaced = await bridged.new(text_prompt("override", "MARKER-NEW-OVERRIDE"))
        checker("override", default)(await bridged.system(replaced), "MARKER-NEW-OVERRIDE")


@pytest.mark.parametrize("mode", ["append", "override"])
async def test_prompt_follows_the_session_through_load_resume_and_fork(
    rig: ClaudeRig, mode: str
) -> None:
    # The automatic choice (rig.adapter), also for the release that advertises the field:
    # passed through natively, its CLI pins the first prompt of a session and a changed one
    # on reload is ignored (docs/adapters.md).
    adapter = None
    first, changed, forked = (f"MARKER-{mode.upper()}-{n}" for n in ("ONE", "TWO", "FORK"))
    async with rig.bridge(adapter=adapter) as bridged:
        default = DefaultPrompt.from_text(await bridged.system(await bridged.new(None)))
        check = checker(mode, default)
        session = await bridged.new(text_prompt(mode, first))
        check(await bridged.system(session), first)
        # load after close, the prompt re-sent
        await bridged.close(session)
        await bridged.reopen("session/load", session, text_prompt(mode, first))
        check(await bridged.system(session), first)
    async with rig.bridge(adapter=adapter) as bridged:  # an editor restart: same state file
        # resume with the prompt omitted: on_omitted=keep re-delivers the stored one
        await bridged.reopen("session/resume", session, None)
        check(await bridged.system(session), first)
        # load of the live session with a changed prompt: the changed one applies
        await bridged.reopen("session/load", session, text_prompt(mode, changed))
        check(await bridged.system(session), changed, first)
        # fork with the prompt omitted inherits the parent's
        child = await bridged.reopen("session/fork", session, None)
        assert child != session
        check(await bridged.system(child), changed, first)
        # fork with its own prompt
        other = await bridged.reopen("session/fork", session, text_prompt(mode, forked))
        check(await bridged.system(other), forked, changed)
    async with rig.bridge(on_omitted="default", adapter=adapter) as bridged:
        # omitted with on_omitted=default: the agent's own prompt, no marker
        await bridged.reopen("session/resume", session, None)
        system = await bridged.system(session)
        assert default.share_in(system) >= KEPT_AT_LEAST
        assert changed not in system
        assert first not in system
        # and a prompt given again after that still applies (nothing pinned meanwhile)
        await bridged.close(session)
        await bridged.reopen("session/load", session, text_prompt(mode, forked))
        check(await bridged.system(session), forked, changed)


# ---------------------------------------------------------------------------------------
# acp-bridge verify


def _verify_config(tmp_path: Path) -> Path:
    """A user config whose claude presets start the cached installs instead of npx."""
    lines = ["agents:"]
    for preset, (package, version) in (
        ("claude-legacy", agents.CLAUDE_LEGACY),
        ("claude", agents.CLAUDE_NATIVE),
    ):
        command = agents.claude_agent_command(package, version)
        lines += [
            f"  {preset}:",
            f"    command: {command[0]!r}",
            f"    args: [{command[1]!r}]",
        ]
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("preset", ["claude-legacy", "claude"])
async def test_verify_passes_every_row_for_the_claude_presets(preset: str, tmp_path: Path) -> None:
    config = await trio.to_thread.run_sync(_verify_config, tmp_path)
    env = {**agents.clean_agent_env(os.environ), "HOME": str(tmp_path)}
    report = await run_verify("--config", str(config), "--agent", preset, env=env, timeout=600)
    report.assert_passed()
    table = report.table
    rows = [line for line in table.splitlines() if line.endswith(("PASS", "FAIL", "SKIP"))]
    steps = " | ".join(rows)
    for step in (
        "session/new",
        "load after close, prompt re-sent",
        "resume after restart, omitted (keep)",
        "load of a live session, changed prompt",
        "fork with its own prompt",
        "load after restart, omitted (default)",
    ):
        assert step in steps
    for mode in ("append", "override"):
        assert sum(f"  {mode}  " in row for row in rows) == 6
    assert all(row.endswith("PASS") for row in rows), table
    assert "0 failed" in table


def _claude_endpoint_env() -> list[str]:
    """verify's --env options that point claude-agent-acp at the endpoint (the claude
    preset's verify section, spelled out on the command line)."""
    pairs = {
        "ANTHROPIC_BASE_URL": "${ENDPOINT_URL}",
        "ANTHROPIC_API_KEY": "sk-ant-acp-bridge-verify",
        "HOME": "${VERIFY_HOME}",
        "IS_SANDBOX": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return [arg for name, value in pairs.items() for arg in ("--env", f"{name}={value}")]


async def test_verify_of_the_plain_command_line_of_the_current_package_passes_every_row(
    tmp_path: Path,
) -> None:
    # `acp-bridge verify -- <claude-agent-acp 0.101.0>`: no preset, no --adapter. The
    # automatic choice must be the adapter that passes every row (spec section 7).
    command = await trio.to_thread.run_sync(agents.claude_agent_command, *agents.CLAUDE_NATIVE)
    env = {**agents.clean_agent_env(os.environ), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    report = await run_verify(
        "--endpoint",
        "anthropic",
        *_claude_endpoint_env(),
        "--",
        *command,
        env=env,
        timeout=600,
    )
    report.assert_passed()
    assert "adapter claude;" in report.stderr
    rows = [line for line in report.table.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert len(rows) == 13 and all(row.endswith("PASS") for row in rows), report.table
    # Quiet: progress lines only; the agent's own output is in the file.
    assert len(report.stderr.splitlines()) <= 20, report.stderr


# ---------------------------------------------------------------------------------------
# _meta.systemPrompt: older SDK clients, and claude-agent-acp's own forms


@pytest.fixture
async def current_rig(tmp_path: Path) -> AsyncIterator[ClaudeRig]:
    """claude-agent-acp 0.101.0, the package the README's examples use."""
    command = await trio.to_thread.run_sync(agents.claude_agent_command, *agents.CLAUDE_NATIVE)
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    async with open_model_endpoint() as endpoint:
        yield ClaudeRig(command, "claude", tmp_path, endpoint)


async def _new_with_meta(bridged: Bridged, meta: dict[str, Any]) -> str:
    with trio.fail_after(TIMEOUT):
        result = await bridged.client.request(
            "session/new", {"cwd": bridged.rig.cwd, "mcpServers": [], "_meta": meta}
        )
    return str(result["sessionId"])


async def test_a_prompt_sent_only_in_meta_by_an_older_sdk_client_reaches_the_model(
    current_rig: ClaudeRig,
) -> None:
    # What agent-client-protocol 0.12.1 (Python SDK) sends for new_session(systemPrompt=...):
    # the RFD object in _meta.systemPrompt, because its schema predates the field.
    async with current_rig.bridge() as bridged:
        default = DefaultPrompt.from_text(await bridged.system(await bridged.new(None)))
        session = await _new_with_meta(
            bridged, {"systemPrompt": text_prompt("append", "MARKER-FROM-META")}
        )
        checker("append", default)(await bridged.system(session), "MARKER-FROM-META")


async def test_claudes_own_meta_string_form_reaches_the_model_as_sent(
    current_rig: ClaudeRig,
) -> None:
    # A client that speaks claude-agent-acp's own _meta.systemPrompt (a string replaces
    # the preset) keeps doing so through the bridge.
    async with current_rig.bridge() as bridged:
        default = DefaultPrompt.from_text(await bridged.system(await bridged.new(None)))
        session = await _new_with_meta(
            bridged, {"systemPrompt": "You are MARKER-OWN-STRING, a terse assistant."}
        )
        system = await bridged.system(session)
    assert "You are MARKER-OWN-STRING, a terse assistant." in system
    assert default.share_in(system) <= GONE_AT_MOST


@dataclass
class Trickle:
    """A client's output that arrives in pieces, as from a slow editor: the bridge reads a
    long line in several reads."""

    stream: Any
    piece: int = 96 * 1024

    async def send_all(self, data: bytes) -> None:
        for start in range(0, len(data), self.piece):
            await self.stream.send_all(data[start : start + self.piece])
            await trio.sleep(0.02)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def test_a_long_prompt_line_passes_through_as_it_arrives(current_rig: ClaudeRig) -> None:
    # About 480 KiB of user text (what the CLI still takes as one turn), written in pieces:
    # the bridge passes the session/prompt line on while it is still arriving and judges it
    # on the way; the agent reads every byte, and the session keeps the client's prompt.
    text = "".join(f"line {n:06d} of a long pasted file, with “quotes” and \\ escapes\n"
                   for n in range(7_500))  # fmt: skip
    assert len(text.encode()) > 3 * STREAM_AFTER // 2
    async with current_rig.bridge() as bridged:
        session = await bridged.new(text_prompt("append", "MARKER-LONG-LINE"))
        bridged.client.send_stream = Trickle(bridged.client.send_stream)  # type: ignore[assignment]
        with trio.fail_after(TIMEOUT):
            await bridged.client.request(
                "session/prompt",
                {"sessionId": session, "prompt": [{"type": "text", "text": text}]},
            )
            while True:
                calls = current_rig.endpoint.main_requests("anthropic")
                matching = [call for call in calls if any(text in t for t in call.user_texts())]
                if matching:
                    break
                await current_rig.endpoint.wait_for_requests(len(calls) + 1, TIMEOUT)
    assert "MARKER-LONG-LINE" in matching[0].system_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="Claude Code refuses this only to root")
async def test_as_root_with_is_sandbox_not_1_session_new_says_what_to_set(tmp_path: Path) -> None:
    """Measured: as root, IS_SANDBOX=yes makes claude-agent-acp start Claude Code allowing
    --dangerously-skip-permissions, which Claude Code refuses (unset or 1 both work). The
    bridge adds a hint to the agent's error and changes nothing else."""
    command = await trio.to_thread.run_sync(agents.claude_agent_command, *agents.CLAUDE_NATIVE)
    async with open_model_endpoint() as endpoint:
        rig = ClaudeRig(command, "claude", tmp_path, endpoint)
        env = {**rig.env(), "IS_SANDBOX": "yes"}
        argv = [sys.executable, "-m", "acp_bridge", "--state", rig.state, "--", *command]
        async with spawn_bridge(argv, env=env) as (client, _process):
            with trio.fail_after(TIMEOUT):
                await client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                Path(rig.cwd).mkdir()
                with pytest.raises(ClientRequestError) as refused:
                    await client.request("session/new", {"cwd": rig.cwd, "mcpServers": []})
    message = refused.value.error["message"]
    assert "--dangerously-skip-permissions cannot be used with root/sudo privileges" in message
    assert "IS_SANDBOX=1" in message and "unset IS_SANDBOX" in message, message
    assert endpoint.main_requests("anthropic") == []
