"""End to end: the real qwen-code 0.24.4 (``qwen --acp``) behind the bridge CLI.

qwen sends its model calls to the embedded endpoint (OpenAI Chat Completions flavour)
through ``OPENAI_BASE_URL``; every test asserts on the system message of the main model
request of a turn (qwen also makes memory and suggestion requests with other prompts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import agents  # tests/agents.py: installs and caches the pinned agents
import pytest
import trio
from acp_requests import append, override
from agent_processes import wait_for_spare
from bridge_cli import isolated_env
from conftest import verify_cached_preset
from pooled_agent import (
    PooledAgent,
    assert_interleaved_sessions_keep_their_prompts,
    assert_no_process_outlives_the_client,
    default_lines,
    open_pooled_agent,
    share_of,
)

pytestmark = pytest.mark.e2e

TIMEOUT = 180.0


def qwen_env(home: Path, endpoint_url: str) -> dict[str, str]:
    return isolated_env(
        home,
        without=("QWEN_", "OPENAI_"),
        OPENAI_API_KEY="sk-acp-bridge-e2e",
        OPENAI_BASE_URL=f"{endpoint_url}/v1",
        OPENAI_MODEL="fake-model",
    )


@pytest.fixture(scope="module")
def qwen_command() -> list[str]:
    return agents.qwen_command()


@pytest.fixture
async def qwen(qwen_command: list[str], tmp_path: Path) -> AsyncIterator[PooledAgent]:
    async with open_pooled_agent(qwen_command, qwen_env, "openai-chat", tmp_path) as qwen:
        (qwen.home / ".qwen").mkdir()
        (qwen.home / ".qwen" / "QWEN.md").write_text("USER-CONTEXT-MARK\n")
        yield qwen


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
        baseline, with_append, with_override = await qwen.systems_of(
            None, append("MARKER-APPEND-1\nline two"), override("MARKER-OVERRIDE-1")
        )
    default = base_lines(baseline)
    assert len(default) > 20 and "MARKER" not in baseline
    assert_appended(with_append, "MARKER-APPEND-1\nline two", default)
    assert_overridden(with_override, "MARKER-OVERRIDE-1", default)
    assert "USER-CONTEXT-MARK" in with_override  # context files follow an override too


async def test_sessions_with_different_prompts_interleave_on_one_connection(
    qwen: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        await assert_interleaved_sessions_keep_their_prompts(qwen)


TRICKY = "$HOME {{x}} ${AvailableTools}\n@not/an/import.md\nend of text  \n\n"


async def test_template_like_text_arrives_as_sent(qwen: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        with_append, with_override = await qwen.systems_of(
            append("  MARKER-T\n" + TRICKY), override("  MARKER-T\n" + TRICKY)
        )
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


async def test_a_spare_process_serves_the_next_override_prompt_with_its_text(
    qwen: PooledAgent, tmp_path: Path
) -> None:
    config = tmp_path / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    qwen: {spare: true}\n")
    with trio.fail_after(TIMEOUT * 2):
        async with qwen.bridge("--config", str(config)) as client:
            baseline = (await qwen.ask(client, await qwen.new_session(client))).system_text()
            first = await qwen.new_session(client, override("MARKER-FIRST"))
            # Started and initialized while its QWEN_SYSTEM_MD does not exist yet.
            spare, prompt_file = await wait_for_spare(qwen.processes, "QWEN_SYSTEM_MD")
            second = await qwen.new_session(client, override("MARKER-SECOND\n  as sent "))
            assert prompt_file.read_text() == "MARKER-SECOND\n  as sent "
            assert spare in qwen.processes()
            seen = [(await qwen.ask(client, s)).system_text() for s in (first, second)]
    default = base_lines(baseline)
    assert_overridden(seen[0], "MARKER-FIRST", default)
    assert_overridden(seen[1], "MARKER-SECOND\n  as sent ", default)
    assert "MARKER-SECOND" not in seen[0] and "MARKER-FIRST" not in seen[1]
    assert not prompt_file.exists()


async def test_no_qwen_process_is_left_after_the_client_disconnects(qwen: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        await assert_no_process_outlives_the_client(qwen)


async def test_verify_passes_for_the_qwen_preset(qwen_command: list[str], tmp_path: Path) -> None:
    # The shipped preset runs qwen through npx; point it at the cached install instead.
    report = await verify_cached_preset(tmp_path, "qwen", qwen_command, 4 * TIMEOUT)
    report.assert_passed()
    assert report.table.count("PASS") >= 6
