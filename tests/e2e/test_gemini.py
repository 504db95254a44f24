"""End to end: the real gemini-cli 0.61.0 (``gemini --acp``) behind the bridge CLI.

gemini sends its model calls to the embedded endpoint (Gemini ``streamGenerateContent``
flavour) through ``GOOGLE_GEMINI_BASE_URL``; every test asserts on the
``systemInstruction`` of the main model request of a turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import agents  # tests/agents.py: installs and caches the pinned agents
import pytest
import trio
from acp_requests import append, override
from agent_processes import environment_values, wait_for_spare
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

from acp_bridge.runtime.client import ClientRequestError, spawn_bridge

pytestmark = pytest.mark.e2e

TIMEOUT = 180.0
WORD_JOINER = "\u2060"


def gemini_env(home: Path, endpoint_url: str) -> dict[str, str]:
    return isolated_env(
        home,
        without=("GEMINI_", "GOOGLE_"),
        GEMINI_API_KEY="acp-bridge-e2e-key",
        GOOGLE_GEMINI_BASE_URL=endpoint_url,
        GEMINI_MODEL="gemini-2.5-flash",
        # One node process per agent, not a relaunched child.
        GEMINI_CLI_NO_RELAUNCH="true",
    )


@pytest.fixture(scope="module")
def gemini_command() -> list[str]:
    return agents.gemini_command()


@pytest.fixture
async def gemini(gemini_command: list[str], tmp_path: Path) -> AsyncIterator[PooledAgent]:
    async with open_pooled_agent(gemini_command, gemini_env, "gemini", tmp_path) as gemini:
        (gemini.home / ".gemini").mkdir()
        # The user's own memory: kept by every process, append and override alike.
        (gemini.home / ".gemini" / "GEMINI.md").write_text("USER-MEMORY-MARK\n")
        yield gemini


async def test_append_lands_at_the_end_and_override_replaces_the_default(
    gemini: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT):
        baseline, with_append, with_override = await gemini.systems_of(
            None, append("MARKER-APPEND-1\nline two"), override("MARKER-OVERRIDE-1")
        )
    default = default_lines(baseline)
    assert len(default) > 20 and "MARKER" not in baseline
    assert "USER-MEMORY-MARK" in baseline
    # append: the default and the user's memory kept, the text at the end (gemini's short
    # context footer may follow it).
    # Only lines naming a path under the home differ: gemini names the private home.
    missing = [line for line in default if line not in with_append]
    assert all(str(gemini.home) in line for line in missing), missing
    assert "MARKER-APPEND-1\nline two" in with_append
    assert with_append.index("USER-MEMORY-MARK") < with_append.index("MARKER-APPEND-1")
    assert len(with_append) - with_append.index("MARKER-APPEND-1") < 1000
    # override: the text first, gemini's default gone, the user's memory still after it.
    assert with_override.startswith("MARKER-OVERRIDE-1")
    assert share_of(default, with_override) < 0.1
    assert "USER-MEMORY-MARK" in with_override


async def test_sessions_with_different_prompts_interleave_on_one_connection(
    gemini: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        await assert_interleaved_sessions_keep_their_prompts(gemini)


TRICKY = "$HOME {{x}} ${AvailableTools} ${SubAgents}\n@not/an/import.md\n\n\nend of text  \n\n"


async def test_template_like_text_arrives_as_sent(gemini: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        with_append, with_override = await gemini.systems_of(
            append("MARKER-T\n" + TRICKY), override("MARKER-T\n" + TRICKY)
        )
    # gemini trims the text and folds three or more newlines into two (docs/agents.md).
    sent = ("MARKER-T\n" + TRICKY).strip().replace("\n\n\n", "\n\n")
    assert sent in with_append
    # In an override gemini substitutes ${AvailableTools} and friends; the bridge keeps
    # them from it with a word joiner after the "$".
    protected = sent.replace("${", "$" + WORD_JOINER + "{")
    assert with_override.startswith(protected)
    assert "- read_file" not in with_override.split("end of text")[0]


async def test_session_load_after_a_restart_is_gemini_s_own_answer(gemini: PooledAgent) -> None:
    with trio.fail_after(TIMEOUT):
        async with gemini.bridge() as client:
            session = await gemini.new_session(client, append("MARKER-L"))
            await gemini.ask(client, session)
        async with gemini.bridge() as client:
            try:
                await gemini.reopen(client, "session/load", session)
            except ClientRequestError as failed:
                # gemini 0.61.0's session/load is broken upstream; the bridge passes the
                # agent's own error on, not one of its own.
                assert failed.code == -32603
                assert "details" in failed.error["data"]
                return
            # When gemini does load it, the session runs with its stored prompt.
            assert "MARKER-L" in (await gemini.ask(client, session)).system_text()


async def test_append_home_is_private_and_the_users_settings_are_untouched(
    gemini: PooledAgent,
) -> None:
    user_dir = gemini.home / ".gemini"
    (user_dir / "settings.json").write_text(json.dumps({"ui": {"theme": "ANSI"}}))
    with trio.fail_after(TIMEOUT):
        async with gemini.bridge() as client:
            session = await gemini.new_session(client, append("MARKER-P"))
            system = (await gemini.ask(client, session)).system_text()
            private = [
                Path(value)
                for pid in gemini.processes()
                for value in environment_values(pid, "GEMINI_CLI_HOME")
            ]
            assert private, "no process runs with a private GEMINI_CLI_HOME"
            (home,) = set(private)
            assert oct(home.stat().st_mode & 0o777) == "0o700"
            settings = json.loads((home / ".gemini" / "settings.json").read_text())
            assert settings["ui"] == {"theme": "ANSI"}
            assert (home / ".gemini" / "GEMINI.md").resolve() == user_dir / "GEMINI.md"
    assert "MARKER-P" in system and "USER-MEMORY-MARK" in system
    assert not home.exists()
    # gemini itself (the primary) writes history there; the bridge adds nothing.
    assert not (user_dir / "acp-bridge-system-prompt.md").exists()
    assert json.loads((user_dir / "settings.json").read_text()) == {"ui": {"theme": "ANSI"}}


async def test_a_spare_process_serves_the_next_append_prompt_with_its_text(
    gemini: PooledAgent, tmp_path: Path
) -> None:
    config = tmp_path / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    gemini: {spare: true}\n")
    context = ".gemini/acp-bridge-system-prompt.md"
    with trio.fail_after(TIMEOUT * 2):
        async with gemini.bridge("--config", str(config)) as client:
            first = await gemini.new_session(client, append("MARKER-FIRST"))
            # Started with its private home ready but for the prompt's context file.
            spare, prompt_file = await wait_for_spare(gemini.processes, "GEMINI_CLI_HOME", context)
            assert (prompt_file.parent / "settings.json").is_file()
            second = await gemini.new_session(client, append("MARKER-SECOND\nline two"))
            assert prompt_file.read_text() == "MARKER-SECOND\nline two"
            assert spare in gemini.processes()
            seen = [(await gemini.ask(client, s)).system_text() for s in (first, second)]
    assert "MARKER-FIRST" in seen[0] and "MARKER-SECOND" not in seen[0]
    assert "MARKER-SECOND\nline two" in seen[1] and "MARKER-FIRST" not in seen[1]
    assert seen[1].index("USER-MEMORY-MARK") < seen[1].index("MARKER-SECOND")
    assert len(seen[1]) - seen[1].index("MARKER-SECOND") < 1000
    assert not prompt_file.exists()


async def test_gemini_reads_its_system_md_during_initialize(
    gemini: PooledAgent, tmp_path: Path
) -> None:
    """Why no spare is kept for override: a GEMINI_SYSTEM_MD written after the process
    started is too late, gemini fails initialize without it."""
    missing = tmp_path / "not-yet" / "system.md"
    env = {**gemini.env, "GEMINI_SYSTEM_MD": str(missing)}
    with trio.fail_after(TIMEOUT), pytest.raises(ClientRequestError) as failed:
        async with spawn_bridge(gemini.command, env) as (client, _):
            await client.request("initialize", {"protocolVersion": 1})
    assert "missing system prompt file" in json.dumps(failed.value.error)


async def test_no_gemini_process_is_left_after_the_client_disconnects(
    gemini: PooledAgent,
) -> None:
    with trio.fail_after(TIMEOUT):
        await assert_no_process_outlives_the_client(gemini)


async def test_verify_passes_for_the_gemini_preset(
    gemini_command: list[str], tmp_path: Path
) -> None:
    # The shipped preset runs gemini through npx; point it at the cached install instead.
    report = await verify_cached_preset(tmp_path, "gemini", gemini_command, 4 * TIMEOUT)
    report.assert_passed()
    assert report.table.count("PASS") >= 3
