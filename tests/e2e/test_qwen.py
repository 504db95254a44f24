"""End to end: the real qwen-code 0.24.4 (``qwen --acp``) behind the bridge CLI.

qwen sends its model calls to the embedded endpoint (OpenAI Chat Completions flavour)
through ``OPENAI_BASE_URL``; every test asserts on the system message of the main model
request of a turn (qwen also makes memory and suggestion requests with other prompts).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import agents  # tests/agents.py: installs and caches the pinned agents
import pytest
import trio
from conftest import run_verify
from pooled_agent import PooledAgent, append, default_lines, override, share_of

from acp_bridge.client import spawn_bridge
from acp_bridge.model_endpoint import open_model_endpoint

pytestmark = pytest.mark.e2e

TIMEOUT = 180.0


def qwen_env(home: Path, endpoint_url: str) -> dict[str, str]:
    env = agents.clean_agent_env(os.environ)
    for name in ("QWEN_SYSTEM_MD", "QWEN_HOME", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    env.update(
        HOME=str(home),
        OPENAI_API_KEY="sk-acp-bridge-e2e",
        OPENAI_BASE_URL=f"{endpoint_url}/v1",
        OPENAI_MODEL="fake-model",
    )
    return env


@pytest.fixture(scope="module")
def qwen_command() -> list[str]:
    return agents.qwen_command()


@pytest.fixture
async def qwen(qwen_command: list[str], tmp_path: Path) -> AsyncIterator[PooledAgent]:
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "QWEN.md").write_text("USER-CONTEXT-MARK\n")
    cwd = tmp_path / "project"
    cwd.mkdir()
    async with open_model_endpoint() as endpoint:
        yield PooledAgent(
            qwen_command,
            qwen_env(home, endpoint.url),
            tmp_path / "sessions.sqlite3",
            endpoint,
            "openai-chat",
            home,
            cwd,
        )


def base_lines(baseline: str) -> list[str]:
    """Lines of qwen's own base prompt: what comes before its first ``---`` section."""
    return default_lines(baseline.split("\n---\n", 1)[0])


def assert_appended(system: str, marker: str, default: list[str]) -> None:
    """qwen's layout: base, ---, context files, ---, the appended text, ---, memory."""
    assert share_of(default, system) >= 0.95
    assert marker in system
    assert system.index("USER-CONTEXT-MARK") < system.index(marker)


def assert_overridden(system: str, marker: str, default: list[str]) -> None:
    assert system.startswith(marker)
    assert share_of(default, system) < 0.1


async def test_append_and_override_on_session_new(qwen: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        async with qwen.bridge() as client:
            plain = await qwen.new_session(client)
            appended = await qwen.new_session(client, append("MARKER-APPEND-1\nline two"))
            replaced = await qwen.new_session(client, override("MARKER-OVERRIDE-1"))
            baseline = (await qwen.ask(client, plain)).system_text()
            with_append = (await qwen.ask(client, appended)).system_text()
            with_override = (await qwen.ask(client, replaced)).system_text()
    default = base_lines(baseline)
    assert len(default) > 20 and "MARKER" not in baseline
    assert_appended(with_append, "MARKER-APPEND-1\nline two", default)
    assert_overridden(with_override, "MARKER-OVERRIDE-1", default)
    assert "USER-CONTEXT-MARK" in with_override  # context files follow an override too


async def test_sessions_with_different_prompts_interleave_on_one_connection(
    qwen: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with qwen.bridge() as client:
            appended = await qwen.new_session(client, append("MARKER-A"))
            plain = await qwen.new_session(client)
            replaced = await qwen.new_session(client, override("MARKER-O"))
            seen: dict[str, list[str]] = {appended: [], plain: [], replaced: []}

            async def turn(session: str) -> None:
                seen[session].append((await qwen.ask(client, session)).system_text())

            for _ in range(2):
                async with trio.open_nursery() as nursery:
                    for session in seen:
                        nursery.start_soon(turn, session)
    for system in seen[appended]:
        assert "MARKER-A" in system and "MARKER-O" not in system
    for system in seen[plain]:
        assert "MARKER" not in system
    for system in seen[replaced]:
        assert system.startswith("MARKER-O") and "MARKER-A" not in system
    assert all(len(systems) == 2 for systems in seen.values())


TRICKY = "$HOME {{x}} ${AvailableTools}\n@not/an/import.md\nend of text  \n\n"


async def test_template_like_text_arrives_as_sent(qwen: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        async with qwen.bridge() as client:
            appended = await qwen.new_session(client, append("  MARKER-T\n" + TRICKY))
            replaced = await qwen.new_session(client, override("  MARKER-T\n" + TRICKY))
            with_append = (await qwen.ask(client, appended)).system_text()
            with_override = (await qwen.ask(client, replaced)).system_text()
    # An override reaches the model verbatim; an appended text is trimmed by qwen.
    assert with_override.startswith("  MARKER-T\n" + TRICKY)
    assert ("MARKER-T\n" + TRICKY).strip() in with_append


async def test_load_and_resume_after_a_restart_land_in_the_sessions_prompt(
    qwen: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT * 3):
        async with qwen.bridge() as client:
            plain = await qwen.new_session(client)
            appended = await qwen.new_session(client, append("MARKER-A"))
            replaced = await qwen.new_session(client, override("MARKER-O"))
            default = base_lines((await qwen.ask(client, plain)).system_text())
            for session in (appended, replaced):
                await qwen.ask(client, session)

        # Restart, policy keep: the stored prompt, with nothing re-sent.
        async with qwen.bridge() as client:
            await qwen.reopen(client, "session/load", appended)
            await qwen.reopen(client, "session/resume", replaced)
            loaded = (await qwen.ask(client, appended)).system_text()
            resumed = (await qwen.ask(client, replaced)).system_text()
        assert_appended(loaded, "MARKER-A", default)
        assert_overridden(resumed, "MARKER-O", default)

        # Restart, policy default: the omitted prompt means qwen's own default.
        async with qwen.bridge("--on-omitted", "default") as client:
            await qwen.reopen(client, "session/resume", appended)
            await qwen.reopen(client, "session/load", replaced)
            plain_a = (await qwen.ask(client, appended)).system_text()
            plain_o = (await qwen.ask(client, replaced)).system_text()
        for system in (plain_a, plain_o):
            assert "MARKER" not in system and share_of(default, system) >= 0.95


async def test_no_qwen_process_is_left_after_the_client_disconnects(qwen: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        async with spawn_bridge(qwen.bridge_command(), qwen.env) as (client, bridge):
            await client.request("initialize", {"protocolVersion": 1})
            await qwen.new_session(client)
            await qwen.new_session(client, append("MARKER-1"))
            await qwen.new_session(client, override("MARKER-2"))
            assert len(qwen.processes()) >= 3
        assert bridge.returncode == 0
    with trio.fail_after(5):
        while qwen.processes():
            await trio.sleep(0.05)


async def test_verify_passes_for_the_qwen_preset(qwen_command: list[str], tmp_path: Path) -> None:
    # The shipped preset runs qwen through npx; point it at the cached install instead.
    config = tmp_path / "config.yaml"
    node, entry, *args = qwen_command
    config.write_text(
        f"agents:\n  qwen:\n    command: {json.dumps(node)}\n"
        f"    args: {json.dumps([entry, *args])}\n"
    )
    env = {**agents.clean_agent_env(os.environ), "HOME": str(tmp_path)}
    report = await run_verify(
        "--config", str(config), "--agent", "qwen", env=env, timeout=4 * TIMEOUT
    )
    report.assert_passed()
    assert report.table.count("PASS") >= 6
