"""End to end: the real ``@agentclientprotocol/codex-acp`` 2.6.0 (the ``codex`` preset) behind
the bridge CLI, against the model endpoint (OpenAI Responses flavour).

codex-acp 2.x takes ``systemPrompt`` natively in append mode only, and reads its
configuration from ``CODEX_CONFIG`` (JSON), not from its command line. These tests give it
the endpoint's provider there, as a user's own configuration, so an override process
(which the bridge starts with that configuration plus ``model_instructions_file``) can
only reach the endpoint if the user's configuration was kept.

Its codex (0.166.0) sends no ``instructions`` field: its default instructions are the
first developer item, which starts with :data:`DEFAULT_HEAD`; an override replaces
exactly that item. CODEX_HOME is kept outside /tmp (codex refuses to put its helper
binaries under a temporary folder).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import agents  # tests/agents.py: installs and caches the pinned agents
import codex_endpoint
import pytest
import trio
from acp_requests import append, override, session_params
from agent_processes import environment_values, live_processes
from codex_endpoint import TIMEOUT, CodexOnEndpoint, ask, new_session
from conftest import verify_cached_preset

from acp_bridge.model_endpoint import RecordedRequest, open_model_endpoint
from acp_bridge.runtime.client import spawn_bridge

pytestmark = pytest.mark.e2e

# The start of codex 0.166's default instructions, its first developer item.
DEFAULT_HEAD: Final = "You are a coding agent running in the Codex CLI"


@pytest.fixture(scope="module")
def codex_acp() -> list[str]:
    return agents.codex_acp_command()


def user_config(endpoint_url: str) -> dict[str, Any]:
    """The user's CODEX_CONFIG: a custom provider on the endpoint, no approvals, read-only."""
    provider = {
        "name": "test",
        "base_url": f"{endpoint_url}/v1",
        "wire_api": "responses",
        "env_key": "FAKE_OPENAI_API_KEY",
        "request_max_retries": 0,
        "stream_max_retries": 0,
        "supports_websockets": False,
    }
    return {
        "model_provider": codex_endpoint.PROVIDER,
        "model_providers": {codex_endpoint.PROVIDER: provider},
        "model": "gpt-5.4",
        "approval_policy": "never",
        "sandbox_mode": "read-only",
    }


@dataclass
class CodexAcp(CodexOnEndpoint):
    command: list[str]

    def agent_argv(self) -> list[str]:
        return self.command

    def env(self) -> dict[str, str]:
        return {**super().env(), "CODEX_CONFIG": json.dumps(user_config(self.endpoint.url))}

    def processes(self) -> list[int]:
        """Live processes of this CODEX_HOME: codex-acp and the codex app-server it runs."""
        return live_processes(f"CODEX_HOME={self.home}")

    def acp_processes(self) -> list[int]:
        """The codex-acp processes themselves: node running its dist/index.js (not the
        bridge, whose command line names it too)."""
        entry = self.command[-1].encode()
        found = []
        for pid in self.processes():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [entry]:
                    found.append(pid)
            except OSError:
                continue
        return found


@pytest.fixture
async def codex(codex_acp: list[str], tmp_path: Path) -> AsyncIterator[CodexAcp]:
    with codex_endpoint.private_codex_home("codex-acp-home-") as home:
        async with open_model_endpoint() as endpoint:
            yield CodexAcp(home, tmp_path / "sessions.sqlite3", endpoint, command=codex_acp)


def developer(request: RecordedRequest) -> list[str]:
    # No instructions field: the whole system slot is the developer items.
    assert request.instructions is None
    return request.developer_texts()


def has_default(request: RecordedRequest) -> bool:
    return any(text.startswith(DEFAULT_HEAD) for text in developer(request))


def has(request: RecordedRequest, marker: str) -> bool:
    return any(marker in text for text in developer(request))


async def test_initialize_advertises_append_and_the_override_the_bridge_adds(
    codex: CodexAcp,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with spawn_bridge(codex.bridge_argv(), codex.env()) as (client, _):
            result = await client.request("initialize", {"protocolVersion": 1})
    capabilities = result["agentCapabilities"]
    assert result["agentInfo"]["name"] == "@agentclientprotocol/codex-acp"
    assert result["agentInfo"]["version"] == agents.CODEX_ACP_APP_SERVER[1]
    assert capabilities["sessionCapabilities"]["systemPrompt"] == {"mode": {"override": {}}}
    assert capabilities["_meta"]["acp-bridge"]["adapter"] == "codex"


async def test_append_goes_natively_to_the_one_process_next_to_the_default(
    codex: CodexAcp, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            first = await new_session(client, tmp_path, append("MARKER-APPEND-1\nline two"))
            second = await new_session(client, tmp_path, append("MARKER-APPEND-2"))
            one, two = await ask(codex, client, first), await ask(codex, client, second)
            # Native: no process per prompt.
            assert len(codex.acp_processes()) == 1
    assert has(one, "MARKER-APPEND-1\nline two") and has_default(one)
    assert has(two, "MARKER-APPEND-2") and has_default(two)
    assert not has(one, "MARKER-APPEND-2") and not has(two, "MARKER-APPEND-1")


async def test_override_replaces_the_default_instructions(codex: CodexAcp, tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, override("MARKER-OVERRIDE-1 \u00e9"))
            request = await ask(codex, client, session)
            assert len(codex.acp_processes()) == 2
    texts = developer(request)
    # Exactly the default's place: the first developer item is the prompt.
    assert texts[0] == "MARKER-OVERRIDE-1 \u00e9"
    assert not any(DEFAULT_HEAD in text for text in texts)


async def test_sessions_with_different_prompts_on_one_connection_each_get_only_their_own(
    codex: CodexAcp, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            prompts = (append("MARKER-A"), None, override("MARKER-O"), override("MARKER-P"))
            sessions = await codex_endpoint.new_sessions(client, tmp_path, prompts)
            await codex_endpoint.ask_each_twice_at_once(codex, client, sessions)
    appended, plain, replaced, replaced_too = sessions
    markers = {appended: "MARKER-A", replaced: "MARKER-O", replaced_too: "MARKER-P"}
    for session in sessions:
        requests = codex.requests_of(session)
        assert len(requests) == 2
        for request in requests:
            own = markers.get(session)
            others = [m for s, m in markers.items() if s != session]
            assert own is None or has(request, own)
            assert not any(has(request, m) for m in others)
            assert has_default(request) == (session in (appended, plain))


async def test_sessions_reopen_after_a_bridge_restart_with_the_prompt_omitted(
    codex: CodexAcp, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with codex.bridge() as client:
            appended = await new_session(client, tmp_path, append("MARKER-A"))
            replaced = await new_session(client, tmp_path, override("MARKER-O"))
            for session in (appended, replaced):
                await ask(codex, client, session)

        # A restart, policy keep: the stored prompts come back without the client's help.
        async with codex.bridge() as client:
            await client.request("session/load", session_params(tmp_path, appended))
            await client.request("session/resume", session_params(tmp_path, replaced))
            loaded, resumed = [await ask(codex, client, s) for s in (appended, replaced)]
    assert has(loaded, "MARKER-A") and has_default(loaded)
    assert developer(resumed)[0] == "MARKER-O" and not has_default(resumed)


async def test_a_live_session_moves_to_the_process_of_its_changed_override(
    codex: CodexAcp, tmp_path: Path
) -> None:
    # codex-acp 2.6 lets go of a closed session only when its process exits: the bridge
    # stops the old override process, which holds nothing else, and the load goes through.
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, override("MARKER-O1"))
            await ask(codex, client, session)
            before = set(codex.acp_processes())
            await client.request(
                "session/load", session_params(tmp_path, session, override("MARKER-O2"))
            )
            request = await ask(codex, client, session)
            after = set(codex.acp_processes())
    assert developer(request)[0] == "MARKER-O2" and not has(request, "MARKER-O1")
    assert len(before) == len(after) == 2 and len(before & after) == 1


async def test_a_live_session_of_the_primary_cannot_move_to_an_override_process(
    codex: CodexAcp, tmp_path: Path
) -> None:
    # The primary holds the session (native append) and is never stopped for it: the
    # agent's own refusal reaches the client (docs/adapters.md, codex, 2.x).
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, append("MARKER-A"))
            await ask(codex, client, session)
            frame = await client.request_raw(
                "session/resume", session_params(tmp_path, session, override("MARKER-O"))
            )
    assert frame["error"]["code"] == -32600
    assert frame["error"]["data"]["reason"] == "thread_active_writer"


def override_files(pids: list[int]) -> dict[int, Path]:
    """Each process's ``model_instructions_file``, from the CODEX_CONFIG it runs with."""
    files = {}
    for pid in pids:
        for value in environment_values(pid, "CODEX_CONFIG"):
            named = json.loads(value).get("model_instructions_file")
            if named:
                files[pid] = Path(named)
    return files


async def test_a_spare_process_serves_the_next_override_with_its_text(
    codex: CodexAcp, tmp_path: Path
) -> None:
    config = tmp_path / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    codex: {spare: true}\n")
    with trio.fail_after(TIMEOUT * 2):
        async with codex.bridge("--config", str(config)) as client:
            first = await new_session(client, tmp_path, override("MARKER-FIRST"))
            # Started and initialized while its model_instructions_file does not exist.
            while not (
                spares := {
                    pid: path
                    for pid, path in override_files(codex.acp_processes()).items()
                    if not path.exists()
                }
            ):
                await trio.sleep(0.1)
            ((spare, instructions),) = spares.items()
            second = await new_session(client, tmp_path, override("MARKER-SECOND \u00e9"))
            assert instructions.read_text() == "MARKER-SECOND \u00e9"
            assert spare in codex.acp_processes()
            one, two = await ask(codex, client, first), await ask(codex, client, second)
    assert developer(one)[0] == "MARKER-FIRST" and not has(one, "MARKER-SECOND")
    assert developer(two)[0] == "MARKER-SECOND \u00e9" and not has(two, "MARKER-FIRST")
    assert not has_default(two)
    assert not instructions.exists()


async def test_no_process_is_left_after_the_client_closes(codex: CodexAcp, tmp_path: Path) -> None:
    # Two codex-acp processes, each with its codex app-server: the primary takes the
    # append natively, the override has one of its own.
    prompts = (append("MARKER-1"), override("MARKER-2"))
    await codex_endpoint.nothing_is_left_after_the_client_closes(
        codex, tmp_path, prompts, running=2
    )


async def test_verify_passes_for_the_codex_preset(codex_acp: list[str], tmp_path: Path) -> None:
    # The shipped preset runs codex-acp through npx; point it at the cached install instead.
    report = await verify_cached_preset(tmp_path, "codex", codex_acp, 4 * TIMEOUT)
    report.assert_passed()
    assert report.table.count("PASS") >= 9
    # codex keeps a session's (and a fork's parent's) developer message: shown, not hidden.
    assert "LIMIT" in report.table
