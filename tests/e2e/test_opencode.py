"""opencode 1.18.33 through the bridge, end to end, against the embedded model endpoint.

The real opencode binary (npm ``opencode-ai``, cached by ``tests/agents.py``) runs behind
the real bridge command line (``python -m acp_bridge --state FILE -- opencode acp``) with
an isolated HOME and a provider, named in ``OPENCODE_CONFIG_CONTENT``, that speaks Chat
Completions to the endpoint. The npm registry is an unreachable local port, so opencode's
own plugin install stays offline. Each turn opencode also asks for a session title; the
test picks the turn's request by its user text and asserts its system message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import agents
import pytest
import trio
from acp_requests import text_prompt
from agent_home import AgentHome, open_agent_home
from agent_processes import live_processes, wait_for_spare
from bridge_cli import isolated_env, write_verify_config
from conftest import run_verify

from acp_bridge.model_endpoint import RecordedRequest
from acp_bridge.runtime.client import ClientRequestError

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0
# The opening of opencode's own prompt for an OpenAI-compatible model (its default).
OPENCODE_DEFAULT_START = "You are opencode, an interactive CLI tool"
# What opencode's JSON config and agent files would change: substitution, a YAML-looking
# first line, templates, and whitespace at both ends.
AWKWARD = (
    "---\ntitle: not front matter\n---\n  {env:HOME} {file:/etc/hostname} {{x}} ${HOME} $& "
    "\\u007b é\n\t  \n"
)


# The user's own opencode settings of the machine running the tests.
USER_SETTINGS = ("OPENCODE_",)
# An unreachable npm registry: opencode's own plugin install stays offline.
OFFLINE_REGISTRY = {"npm_config_registry": "http://127.0.0.1:9/"}


def mode_choice(result: dict[str, Any]) -> Any:
    """The mode selector a session/new or session/load result offers (opencode 1.18 puts
    its agents in ``configOptions``)."""
    return [option for option in result.get("configOptions", []) if option["id"] == "mode"]


class OpencodeHome(AgentHome):
    """An isolated opencode user: HOME, XDG dirs, its session database."""

    def env(self) -> dict[str, str]:
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": f"{self.endpoint.url}/v1", "apiKey": "sk-fake"},
            "models": {"fake-model": {}},
        }
        config = {
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "provider": {"fake": provider},
        }
        settings = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            **OFFLINE_REGISTRY,
        }
        return self.agent_env(USER_SETTINGS, settings)

    def agent_argv(self) -> list[str]:
        return [str(self.binary), "acp"]

    def processes(self) -> list[int]:
        """Live opencode processes of this home (found by their environment)."""
        return live_processes(f"HOME={self.home}", argv0="opencode.exe")


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    return agents.opencode_binary()


@pytest.fixture
async def opencode(opencode_binary: Path, tmp_path: Path) -> AsyncIterator[OpencodeHome]:
    async with open_agent_home(OpencodeHome, opencode_binary, tmp_path) as home:
        yield home
    assert home.processes() == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` arrived whole as opencode's instructions entry, after its own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(OPENCODE_DEFAULT_START) and f".md\n{text}\n" in system


def replaced(request: RecordedRequest, text: str) -> bool:
    """``text`` opens the system message and opencode's own prompt is gone."""
    (system,) = request.system_blocks()
    return system.startswith(text + "\n") and OPENCODE_DEFAULT_START not in system


async def test_append_reaches_the_model_as_sent(opencode: OpencodeHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            request = await run.turn(session)
    assert appended(request, AWKWARD)
    assert "Instructions from: " in request.system_text()


async def test_override_replaces_opencodes_prompt_and_keeps_its_modes(
    opencode: OpencodeHome,
) -> None:
    native = agents.probe_initialize(opencode.agent_argv(), opencode.env())["result"]
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            plain = await run.new_result()
            other = await run.new_result(text_prompt("override", AWKWARD))
            session = other["sessionId"]
            request = await run.turn(session)
            # The user switches to opencode's other mode: still the client's prompt.
            await run.client.request(
                "session/set_config_option",
                {"sessionId": session, "configId": "mode", "value": "plan"},
            )
            planned = await run.turn(session)
            plain_request = await run.turn(plain["sessionId"])
    capabilities = dict(run.initialize["agentCapabilities"])
    session_capabilities = dict(capabilities.pop("sessionCapabilities"))
    assert session_capabilities.pop("systemPrompt") == {"mode": {"override": {}}}
    capabilities.pop("_meta")
    assert capabilities == {
        k: v for k, v in native["agentCapabilities"].items() if k != "sessionCapabilities"
    }
    assert session_capabilities == native["agentCapabilities"]["sessionCapabilities"]
    (choice,) = mode_choice(other)
    assert [option["value"] for option in choice["options"]] == ["build", "plan"]
    assert mode_choice(other) == mode_choice(plain)
    assert replaced(request, AWKWARD)
    assert replaced(planned, AWKWARD)
    assert plain_request.system_text().startswith(OPENCODE_DEFAULT_START)


async def test_sessions_with_different_prompts_share_one_connection(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with opencode.bridge() as run:
            plain = await run.new()
            first = await run.new(text_prompt("append", "MARKER-ONE"))
            second = await run.new(text_prompt("override", "MARKER-TWO"))
            assert len(opencode.processes()) == 3
            seen = await run.turns_at_once(plain, first, second)
            listed = await run.client.request("session/list", {"cwd": opencode.cwd})
    assert "MARKER" not in seen[plain].system_text()
    assert seen[plain].system_text().startswith(OPENCODE_DEFAULT_START)
    assert appended(seen[first], "MARKER-ONE") and "MARKER-TWO" not in seen[first].system_text()
    assert replaced(seen[second], "MARKER-TWO")
    # Every process shares the user's session database: one list has them all.
    assert {plain, first, second} <= {s["sessionId"] for s in listed["sessions"]}


async def test_load_after_a_bridge_restart_keeps_each_sessions_prompt(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with opencode.bridge() as run:
            first = await run.new(text_prompt("append", AWKWARD))
            second = await run.new(text_prompt("override", AWKWARD))
            await run.turn(first)
            await run.turn(second)
        assert opencode.processes() == []
        # An editor restart: the prompt is omitted on load and the bridge keeps it.
        async with opencode.bridge() as run:
            await run.reopen("session/load", first)
            loaded = await run.reopen("session/load", second)
            first_again = await run.turn(first)
            second_again = await run.turn(second)
    assert appended(first_again, AWKWARD)
    assert replaced(second_again, AWKWARD)
    assert first_again.user_texts()[0] != first_again.last_user_text()  # history kept
    assert [o["currentValue"] for o in mode_choice(loaded)] == ["build"]


async def test_the_users_own_config_stays_in_force_under_the_bridges_layer(
    opencode: OpencodeHome,
) -> None:
    config_dir = opencode.home / ".config" / "opencode"
    config_dir.mkdir(parents=True)
    own_instructions = opencode.root / "mine.md"
    own_instructions.write_text("USER-INSTRUCTIONS\n")
    own = {"instructions": [str(own_instructions)], "agent": {"build": {"prompt": "USER-BUILD"}}}
    (config_dir / "opencode.json").write_text(json.dumps(own))
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            plain = await run.turn(await run.new())
            extended = await run.turn(await run.new(text_prompt("append", "MARKER-A")))
            replaced_by_client = await run.turn(await run.new(text_prompt("override", "MARKER-O")))
    assert plain.system_text().startswith("USER-BUILD\n")
    # append adds to the user's instructions; override replaces the user's agent prompt too.
    assert extended.system_text().startswith("USER-BUILD\n")
    assert "USER-INSTRUCTIONS" in extended.system_text() and "MARKER-A" in extended.system_text()
    assert replaced(replaced_by_client, "MARKER-O")
    assert "USER-BUILD" not in replaced_by_client.system_text()
    assert "USER-INSTRUCTIONS" in replaced_by_client.system_text()
    # opencode itself adds a "$schema" key to the user's file (without the bridge too).
    after = json.loads((config_dir / "opencode.json").read_text())
    after.pop("$schema", None)
    assert after == own


async def test_empty_override_is_refused_not_replaced_by_opencodes_own(
    opencode: OpencodeHome,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", ""))
    assert refused.value.code == -32602
    assert "empty override" in refused.value.error["message"]


async def test_a_spare_process_serves_the_next_prompt_of_its_mode_with_its_text(
    opencode: OpencodeHome,
) -> None:
    config = opencode.root / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    opencode: {spare: true}\n")
    pids = opencode.processes
    with trio.fail_after(TIMEOUT * 4):
        async with opencode.bridge("--config", str(config)) as run:
            first = await run.new(text_prompt("append", "MARKER-FIRST"))
            # Started and initialized while the configuration it is named does not exist.
            spare, config_file = await wait_for_spare(pids, "OPENCODE_CONFIG")
            second = await run.new(text_prompt("append", AWKWARD))
            assert "system-prompt.md" in config_file.read_text()
            assert spare in pids()
            # An override prompt: a new process (the spare is for append), then a spare
            # for override, whose configuration carries the prompt itself.
            append_spare, _ = await wait_for_spare(pids, "OPENCODE_CONFIG")
            third = await run.new(text_prompt("override", "MARKER-THIRD"))
            other_spare, other_config = await wait_for_spare(
                pids, "OPENCODE_CONFIG", but=append_spare
            )
            fourth = await run.new(text_prompt("override", "MARKER-FOURTH"))
            assert "MARKER-FOURTH" in other_config.read_text()
            assert other_spare in pids()
            seen = await run.turns_at_once(first, second, third, fourth)
    assert appended(seen[first], "MARKER-FIRST") and AWKWARD not in seen[first].system_text()
    assert appended(seen[second], AWKWARD) and "MARKER" not in seen[second].system_text()
    assert replaced(seen[third], "MARKER-THIRD")
    assert replaced(seen[fourth], "MARKER-FOURTH")
    assert "MARKER-THIRD" not in seen[fourth].system_text()
    assert not config_file.exists() and not other_config.exists()


async def test_no_opencode_process_outlives_the_client(opencode: OpencodeHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with opencode.bridge() as run:
            await run.new(text_prompt("append", "MARKER-A"))
            await run.new(text_prompt("override", "MARKER-O"))
            assert len(opencode.processes()) == 3
        # spawn_bridge closed the bridge's stdin and waited for it to exit.
        assert opencode.processes() == []


async def test_verify_passes_every_step_against_real_opencode(
    opencode_binary: Path, tmp_path: Path
) -> None:
    config = write_verify_config(
        tmp_path / "config.yaml", "opencode", [str(opencode_binary), "acp"]
    )
    env = isolated_env(tmp_path, without=USER_SETTINGS, **OFFLINE_REGISTRY)
    report = await run_verify("--config", str(config), "--agent", "opencode", env=env, timeout=600)
    report.assert_passed()
    assert report.table.count("PASS") == 13, report.table
