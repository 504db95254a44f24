"""cline 3.0.65 through the bridge, end to end, against the embedded model endpoint.

The real compiled cline binary (npm ``@cline/cli-linux-x64``, cached by ``tests/agents.py``)
runs behind the real bridge command line (``python -m acp_bridge --state FILE -- cline
--acp``) with an isolated HOME whose cline data names the endpoint's Chat Completions
flavour as an OpenAI-compatible provider (what ``cline auth`` writes). Each turn is one
model request; the tests assert its system message.

cline's ``initialize`` takes seconds per process, so each test does as much as its
lifetimes allow: one connection with several prompts, one restart.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import agents
import pytest
import trio
from acp_requests import text_prompt
from agent_home import AgentHome, BridgeRun, open_agent_home
from agent_processes import environment_values, live_processes, wait_for_spare
from bridge_cli import isolated_env, write_verify_config
from conftest import run_verify

from acp_bridge.model_endpoint import RecordedRequest
from acp_bridge.runtime.client import ClientRequestError

pytestmark = pytest.mark.e2e

TIMEOUT = 240.0
CLINE_DEFAULT_START = "You are Cline, an AI coding agent."
RULE_HEADING = "# Rules\n## acp-bridge-system-prompt\n"
# Things other agents substitute or template, and whitespace inside; cline trims a rules
# file at both ends, so the text sent has none there.
AWKWARD = "${HOME} {{x}} $HOME $& $$ $` $' @README.md {env:HOME} é\n---\n\t  indented"
# The user's own cline settings of the machine running the tests.
USER_SETTINGS = ("CLINE_",)
LOCAL = {"CLINE_SESSION_BACKEND_MODE": "local"}


class ClineHome(AgentHome):
    """An isolated cline user: HOME with ``~/.cline/data`` naming the endpoint."""

    backend: dict[str, str] = LOCAL

    def env(self) -> dict[str, str]:
        settings = {"CLINE_API_KEY": "sk-fake", "CLINE_PROVIDER": "openai-compatible"}
        return self.agent_env(USER_SETTINGS, {**settings, **self.backend})

    def write_provider(self) -> None:
        provider = {
            "provider": "openai-compatible",
            "apiKey": "sk-fake",
            "model": "fake-model",
            "baseUrl": f"{self.endpoint.url}/v1",
        }
        settings = self.home / ".cline" / "data" / "settings"
        settings.mkdir(parents=True)
        # cline ignores a provider entry without `updatedAt`.
        entry = {"settings": provider, "updatedAt": "2026-12-01T00:00:00.000Z"}
        content = {"version": 1, "providers": {"openai-compatible": entry}}
        (settings / "providers.json").write_text(json.dumps(content))

    def agent_argv(self) -> list[str]:
        return [str(self.binary), "--acp"]

    def processes(self, *, only_cline: bool = False) -> list[int]:
        """Live processes of this home (found by their environment): the bridge, cline and
        anything started for it, a hub daemon included (``only_cline``: the cline
        processes, a hub daemon included)."""
        argv0 = str(self.binary) if only_cline else None
        return live_processes(f"HOME={self.home}", argv0=argv0)


@pytest.fixture(scope="session")
def cline_binary() -> Path:
    return agents.cline_binary()


@pytest.fixture
async def cline(cline_binary: Path, tmp_path: Path) -> AsyncIterator[ClineHome]:
    async with open_agent_home(ClineHome, cline_binary, tmp_path) as home:
        home.write_provider()
        yield home
    left = home.processes()
    for pid in left:  # a hub would hold the machine-wide port for every later run
        os.kill(pid, signal.SIGKILL)
    assert left == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` closes the system message as the bridge's rule, after cline's own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(CLINE_DEFAULT_START) and system.endswith(RULE_HEADING + text)


async def turns(run: BridgeRun, *session_ids: str) -> dict[str, RecordedRequest]:
    """One turn in each session, one after the other (not at once, as for the other pooled
    agents). The processes of a connection share the user's cline data folder, so that
    every session stays the user's, and cline writes its sessions index there through one
    temporary file name: two turns at once in two processes can fail in cline itself
    (``ENOENT: ... rename 'sessions.index.json.tmp' -> 'sessions.index.json'``, -32603 to
    the client; seen once in four CI runs)."""
    return {session_id: await run.turn(session_id) for session_id in session_ids}


async def test_each_prompt_reaches_its_own_sessions_and_no_process_is_left(
    cline: ClineHome,
) -> None:
    # The primary as a user runs it without the preset: cline's hub mode. Only sessions
    # with a prompt are opened, so every session runs in a process the adapter started.
    cline.backend = {}
    with trio.fail_after(TIMEOUT):
        async with cline.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", "MARKER-O"))
            first = await run.new(text_prompt("append", "MARKER-ONE"))
            second = await run.new(text_prompt("append", AWKWARD))
            pids = cline.processes(only_cline=True)
            assert len(pids) == 3
            seen = await turns(run, first, second)
            backends = {
                tuple(environment_values(pid, "CLINE_SESSION_BACKEND_MODE")) for pid in pids
            }
        assert cline.processes() == []
    capabilities = run.initialize["agentCapabilities"]
    assert capabilities["sessionCapabilities"] == {"systemPrompt": {}}  # append only
    assert capabilities["loadSession"] is True
    assert refused.value.code == -32602
    assert appended(seen[first], "MARKER-ONE") and AWKWARD not in seen[first].system_text()
    assert appended(seen[second], AWKWARD) and "MARKER-ONE" not in seen[second].system_text()
    # The two processes of the prompts ran in local mode: no hub daemon was started.
    assert backends == {(), ("local",)}


async def test_a_spare_process_serves_the_next_prompt_with_its_text(cline: ClineHome) -> None:
    config = cline.root / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    cline: {spare: true}\n")
    rule = "rules/acp-bridge-system-prompt.md"
    with trio.fail_after(TIMEOUT * 2):
        async with cline.bridge("--config", str(config)) as run:
            first = await run.new(text_prompt("append", "MARKER-FIRST"))
            # Started and initialized while its rules folder holds no rule of the bridge.
            spare, rule_file = await wait_for_spare(
                lambda: cline.processes(only_cline=True), "CLINE_DIR", rule
            )
            second = await run.new(text_prompt("append", AWKWARD))
            assert rule_file.read_text() == AWKWARD
            assert spare in cline.processes(only_cline=True)
            seen = await turns(run, first, second)
    assert appended(seen[first], "MARKER-FIRST") and AWKWARD not in seen[first].system_text()
    assert appended(seen[second], AWKWARD) and "MARKER-FIRST" not in seen[second].system_text()
    assert not rule_file.exists()


async def test_load_after_a_bridge_restart_keeps_the_sessions_prompt(cline: ClineHome) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with cline.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            plain = await run.new()
            await turns(run, session, plain)
        assert cline.processes() == []
        # An editor restart: the prompt is omitted on load and the bridge keeps it.
        async with cline.bridge() as run:
            await run.reopen("session/load", session)
            await run.reopen("session/load", plain)
            seen = await turns(run, session, plain)
    assert appended(seen[session], AWKWARD)
    assert len(seen[session].user_texts()) == 2  # the first turn's history came back
    assert seen[plain].system_text().startswith(CLINE_DEFAULT_START)
    assert "# Rules" not in seen[plain].system_text()


async def test_verify_passes_every_step_against_real_cline(
    cline_binary: Path, tmp_path: Path
) -> None:
    config = write_verify_config(tmp_path / "config.yaml", "cline", [str(cline_binary), "--acp"])
    env = isolated_env(tmp_path, without=USER_SETTINGS)
    report = await run_verify("--config", str(config), "--agent", "cline", env=env, timeout=900)
    report.assert_passed()
    assert live_processes(f"HOME={tmp_path}") == []
    # cline has no session/resume (load is used), no session/close and no session/fork.
    assert report.table.count("PASS") == 5 and report.table.count("SKIP") == 2, report.table
