"""End to end: the real codex-acp 0.16.0 (the ``codex-legacy`` preset) behind the bridge CLI,
against the model endpoint (2.x: ``test_codex_acp.py``).

Every test runs ``python -m acp_bridge -- <codex-acp> -c model_provider=...`` as a
subprocess with a private ``CODEX_HOME`` whose custom provider points at the embedded
model endpoint (OpenAI Responses flavour), and asserts on what the model received.
CODEX_HOME is kept outside /tmp: codex refuses to put its helper binaries under a
temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agents  # tests/agents.py: installs and caches the pinned agents
import codex_endpoint
import pytest
import trio
from acp_requests import append, override, prompt_params, session_params
from agent_processes import live_processes
from codex_endpoint import TIMEOUT, CodexOnEndpoint, ask, new_session
from conftest import verify_cached_preset

from acp_bridge.model_endpoint import RecordedRequest, open_model_endpoint
from acp_bridge.runtime.client import AcpClient
from acp_bridge.runtime.embedded import open_embedded_bridge
from acp_bridge.runtime.relay import BridgeOptions
from acp_bridge.state.store import SessionStore

pytestmark = pytest.mark.e2e

# The start of codex's own base instructions (codex.md §TL;DR).
CODEX_DEFAULT_START = "You are Codex"


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    binary: Path = agents.codex_acp_binary()
    return binary


def processes_with_home(
    codex_home: Path, *, only_codex: bool = False, exact: bool = False
) -> list[int]:
    """Pids of live processes whose environment names this CODEX_HOME (or a private home
    the bridge made inside it): codex-acp and whatever it started (``only_codex``: the
    codex-acp processes themselves)."""
    return live_processes(
        f"CODEX_HOME={codex_home}", prefix=not exact, argv0="/codex-acp" if only_codex else None
    )


@dataclass
class CodexSetup(CodexOnEndpoint):
    binary: Path

    def agent_argv(self) -> list[str]:
        """codex-acp on the endpoint, never asking for approval, unable to write."""
        return [
            str(self.binary),
            *agents.codex_endpoint_args(codex_endpoint.PROVIDER, "test", self.endpoint.url),
            "-c",
            "approval_policy=never",
            "-c",
            "sandbox_mode=read-only",
        ]

    def processes(self) -> list[int]:
        return processes_with_home(self.home)

    def acp_processes(self) -> list[int]:
        return processes_with_home(self.home, only_codex=True)


@pytest.fixture
async def codex(codex_binary: Path, tmp_path: Path) -> AsyncIterator[CodexSetup]:
    with codex_endpoint.private_codex_home("codex-home-") as home:
        async with open_model_endpoint() as endpoint:
            yield CodexSetup(home, tmp_path / "sessions.sqlite3", endpoint, binary=codex_binary)


def has_developer(request: RecordedRequest, marker: str) -> bool:
    return marker in request.developer_texts()


def default_instructions(request: RecordedRequest) -> bool:
    return (request.instructions or "").startswith(CODEX_DEFAULT_START)


async def test_append_prompt_is_a_developer_message_next_to_codex_instructions(
    codex: CodexSetup, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, append("MARKER-APPEND-1\nline two"))
            request = await ask(codex, client, session)
    assert has_developer(request, "MARKER-APPEND-1\nline two")
    assert default_instructions(request)


async def test_override_prompt_replaces_codex_instructions(
    codex: CodexSetup, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, override("MARKER-OVERRIDE-1 \u00e9"))
            request = await ask(codex, client, session)
    assert request.instructions == "MARKER-OVERRIDE-1 \u00e9"
    assert not any("MARKER" in t for t in request.developer_texts())


async def test_sessions_with_different_prompts_interleave_on_one_connection(
    codex: CodexSetup, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            prompts = (append("MARKER-A"), None, override("MARKER-O"))
            sessions = await codex_endpoint.new_sessions(client, tmp_path, prompts)
            assert len(codex.acp_processes()) == 3
            await codex_endpoint.ask_each_twice_at_once(codex, client, sessions)
    appended, plain, replaced = sessions
    for request in codex.requests_of(appended):
        assert has_developer(request, "MARKER-A") and default_instructions(request)
    for request in codex.requests_of(plain):
        assert default_instructions(request)
        assert not any("MARKER" in t for t in request.developer_texts())
    for request in codex.requests_of(replaced):
        assert request.instructions == "MARKER-O"
        assert not any("MARKER" in t for t in request.developer_texts())
    assert all(len(codex.requests_of(s)) == 2 for s in (appended, plain, replaced))


async def test_sessions_reopen_after_a_bridge_restart_with_their_prompts(
    codex: CodexSetup, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with codex.bridge() as client:
            appended = await new_session(client, tmp_path, append("MARKER-A"))
            replaced = await new_session(client, tmp_path, override("MARKER-O"))
            plain = await new_session(client, tmp_path)
            for session in (appended, replaced, plain):
                await ask(codex, client, session)

        def reopen(method: str, session: str, prompt: dict[str, Any] | None = None) -> Any:
            return client.request(method, session_params(tmp_path, session, prompt))

        # Restart, policy keep: prompts re-sent on load, omitted on resume.
        async with codex.bridge() as client:
            await reopen("session/load", appended, append("MARKER-A"))
            await reopen("session/load", replaced, override("MARKER-O"))
            await reopen("session/resume", plain)
            loaded_a, loaded_o, resumed_plain = [
                await ask(codex, client, s) for s in (appended, replaced, plain)
            ]
            await reopen("session/resume", appended)
            await reopen("session/resume", replaced)
            kept_a, kept_o = [await ask(codex, client, s) for s in (appended, replaced)]
        assert has_developer(loaded_a, "MARKER-A") and default_instructions(loaded_a)
        assert loaded_o.instructions == "MARKER-O"
        assert default_instructions(resumed_plain)
        assert has_developer(kept_a, "MARKER-A") and default_instructions(kept_a)
        assert kept_o.instructions == "MARKER-O"

        # Restart, policy default: codex keeps what the session was created with
        # (documented; the bridge logs that it cannot take the prompts away).
        async with codex.bridge("--on-omitted", "default") as client:
            await reopen("session/resume", appended)
            await reopen("session/load", replaced)
            default_a, default_o = [await ask(codex, client, s) for s in (appended, replaced)]
            # A changed override does apply on reopen: codex replaces the stored base.
            await reopen("session/resume", replaced, override("MARKER-O2"))
            changed_o = await ask(codex, client, replaced)
        assert has_developer(default_a, "MARKER-A")
        assert default_o.instructions == "MARKER-O"
        assert changed_o.instructions == "MARKER-O2"


async def test_cancelled_prompt_stops_with_cancelled(codex: CodexSetup, tmp_path: Path) -> None:
    codex.endpoint.delay = math.inf  # hold every model call until codex gives up on it
    with trio.fail_after(TIMEOUT):
        async with codex.bridge() as client:
            session = await new_session(client, tmp_path, append("MARKER-CANCEL"))
            outcome: dict[str, Any] = {}

            async def prompt() -> None:
                outcome.update(
                    await client.request("session/prompt", prompt_params(session, "Hi."))
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(prompt)
                await codex.endpoint.wait_for_requests(1, timeout=TIMEOUT)
                await client.notify("session/cancel", {"sessionId": session})
    assert outcome == {"stopReason": "cancelled"}
    assert has_developer(codex.requests_of(session)[0], "MARKER-CANCEL")


async def test_no_codex_process_is_left_after_the_client_disconnects(
    codex: CodexSetup, tmp_path: Path
) -> None:
    # A process per prompt: the plain session's primary, and one each for the others.
    prompts = (None, append("MARKER-1"), override("MARKER-2"))
    await codex_endpoint.nothing_is_left_after_the_client_closes(
        codex, tmp_path, prompts, running=3
    )


async def test_verify_passes_for_the_codex_legacy_preset(
    codex_binary: Path, tmp_path: Path
) -> None:
    # The shipped preset runs codex-acp through npx; point it at the cached binary instead.
    report = await verify_cached_preset(tmp_path, "codex-legacy", [str(codex_binary)], 4 * TIMEOUT)
    report.assert_passed()
    # Every step codex can do passes; what it cannot is shown, never hidden.
    assert report.table.count("PASS") >= 8
    assert "SKIP" in report.table  # codex-acp 0.16 has no session/fork
    assert "LIMIT" in report.table  # a changed append prompt cannot reach a stored session


async def test_append_prompt_stays_off_every_command_line(
    codex: CodexSetup, tmp_path: Path
) -> None:
    """The append text goes to a private CODEX_HOME whose config.toml holds it, and the
    sessions stay in the user's CODEX_HOME."""
    marker = "MARKER-PRIVATE-APPEND-7"
    options = BridgeOptions(
        agent_argv=codex.agent_argv(),
        agent_env={"CODEX_HOME": str(codex.home), "FAKE_OPENAI_API_KEY": codex_endpoint.API_KEY},
        shutdown_grace=0.5,
    )

    @asynccontextmanager
    async def bridge() -> AsyncIterator[AcpClient]:
        async with open_embedded_bridge(options, SessionStore(codex.state)) as embedded:
            await embedded.client.request("initialize", {"protocolVersion": 1})
            yield embedded.client

    with trio.fail_after(TIMEOUT * 2):
        async with bridge() as client:
            plain = await new_session(client, tmp_path)
            appended = await new_session(client, tmp_path, append(marker + "\nsecond line"))
            first = await ask(codex, client, appended)
            await ask(codex, client, plain)
            # The primary in the user's CODEX_HOME, the prompt's process in a private one.
            assert len(processes_with_home(codex.home, only_codex=True, exact=True)) == 1
            assert live_processes(f"CODEX_SQLITE_HOME={codex.home}")
            for pid in Path("/proc").iterdir():
                with contextlib.suppress(OSError):
                    assert marker.encode() not in (pid / "cmdline").read_bytes(), pid
            listed = await client.request("session/list", {})
            assert appended in json.dumps(listed)
        # A restart: the stored prompt brings the session back to a private home.
        async with bridge() as client:
            await client.request("session/load", session_params(tmp_path, appended))
            await client.request("session/resume", {"sessionId": plain, "cwd": str(tmp_path)})
            again = await ask(codex, client, appended)
            plain_again = await ask(codex, client, plain)
    assert has_developer(first, marker + "\nsecond line") and default_instructions(first)
    assert has_developer(again, marker + "\nsecond line") and default_instructions(again)
    assert not any(marker in t for t in plain_again.developer_texts())
    assert not [p for p in codex.home.iterdir() if p.name.startswith("acp-bridge-")]
