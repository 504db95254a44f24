"""GitHub Copilot CLI 1.0.102 through the bridge, end to end, against the model endpoint.

The real native copilot binary (npm ``@github/copilot-linux-x64``, cached by
``tests/agents.py``) runs behind the real bridge command line
(``python -m acp_bridge --state FILE -- copilot --acp``) with an isolated HOME, offline,
in its own-provider mode pointed at the endpoint's Chat Completions flavour (no GitHub
login). Each test asserts the system message the model received on a turn, picked by
the turn's user text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

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
COPILOT_DEFAULT_START = "You are GitHub Copilot"
# A YAML-looking first block (copilot reads front matter from instruction files), things
# other agents substitute, and whitespace at both ends.
AWKWARD = (
    "---\napplyTo: nothing/at/all\n---\n  {env:HOME} {file:/etc/hostname} {{x}} ${HOME} $& "
    "@README.md é\n\t  \n"
)
# The user's own copilot settings and GitHub login of the machine running the tests.
USER_SETTINGS = ("COPILOT_", "GH_", "GITHUB_TOKEN")


def unpacked_cache() -> Path:
    """Where copilot unpacks itself on first start, shared by the tests (about 235 MB)."""
    return agents.cache_root().parent / "copilot-unpacked"


class CopilotHome(AgentHome):
    """An isolated copilot user: HOME with its ``~/.copilot`` session store."""

    def env(self) -> dict[str, str]:
        settings = {
            "COPILOT_PROVIDER_BASE_URL": f"{self.endpoint.url}/v1",
            "COPILOT_PROVIDER_API_KEY": "sk-fake",
            "COPILOT_MODEL": "gpt-4.1",
            "COPILOT_OFFLINE": "true",
            "COPILOT_AUTO_UPDATE": "false",
            "COPILOT_PKG_CACHE_HOME": str(unpacked_cache()),
        }
        return self.agent_env(USER_SETTINGS, settings)

    def agent_argv(self) -> list[str]:
        return [str(self.binary), "--acp"]

    def processes(self, *, only_copilot: bool = False) -> list[int]:
        """Live processes of this home (found by their environment): copilot and anything
        it started (``only_copilot``: the copilot processes themselves)."""
        argv0 = str(self.binary) if only_copilot else None
        return live_processes(f"HOME={self.home}", argv0=argv0)


@pytest.fixture(scope="session")
def copilot_binary() -> Path:
    return agents.copilot_binary()


@pytest.fixture
async def copilot(copilot_binary: Path, tmp_path: Path) -> AsyncIterator[CopilotHome]:
    async with open_agent_home(CopilotHome, copilot_binary, tmp_path) as home:
        yield home
    assert home.processes() == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` arrived whole, on lines of its own, after copilot's own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(COPILOT_DEFAULT_START) and f"\n\n{text}\n" in system


async def test_append_reaches_the_model_as_sent(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            request = await run.turn(session)
    assert appended(request, AWKWARD)


async def test_override_is_not_offered_and_is_refused(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", "MARKER-O"))
            started = len(copilot.processes(only_copilot=True))
    capability = run.initialize["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
    assert capability == {}
    assert refused.value.code == -32602
    assert started == 1  # the request never reached a process


async def test_sessions_with_different_prompts_share_one_connection(
    copilot: CopilotHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with copilot.bridge() as run:
            plain = await run.new()
            first = await run.new(text_prompt("append", "MARKER-ONE"))
            second = await run.new(text_prompt("append", "MARKER-TWO"))
            assert len(copilot.processes(only_copilot=True)) == 3
            seen = await run.turns_at_once(plain, first, second)
            listed = await run.client.request("session/list", {})
    assert "MARKER" not in seen[plain].system_text()
    assert seen[plain].system_text().startswith(COPILOT_DEFAULT_START)
    assert appended(seen[first], "MARKER-ONE") and "MARKER-TWO" not in seen[first].system_text()
    assert appended(seen[second], "MARKER-TWO") and "MARKER-ONE" not in seen[second].system_text()
    # Every process shares the user's ~/.copilot: one list has them all.
    assert {plain, first, second} <= {s["sessionId"] for s in listed["sessions"]}


async def test_load_after_a_bridge_restart_keeps_the_sessions_prompt(
    copilot: CopilotHome,
) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with copilot.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            plain = await run.new()
            await run.turn(session)
            await run.turn(plain)
        assert copilot.processes() == []
        # An editor restart: the prompt is omitted on load and the bridge keeps it.
        async with copilot.bridge() as run:
            await run.reopen("session/load", session)
            await run.reopen("session/load", plain)
            again = await run.turn(session)
            plain_again = await run.turn(plain)
    assert appended(again, AWKWARD)
    assert len(again.user_texts()) == 2  # the first turn's history came back
    assert "MARKER" not in plain_again.system_text() and AWKWARD not in plain_again.system_text()


async def test_a_spare_process_serves_the_next_prompt_with_its_text(
    copilot: CopilotHome,
) -> None:
    config = copilot.root / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    copilot: {spare: true}\n")
    instructions = ".github/instructions/acp-bridge.instructions.md"
    with trio.fail_after(TIMEOUT * 2):
        async with copilot.bridge("--config", str(config)) as run:
            first = await run.new(text_prompt("append", "MARKER-FIRST"))
            # Started and initialized while its instructions folder holds no file yet.
            spare, prompt_file = await wait_for_spare(
                lambda: copilot.processes(only_copilot=True),
                "COPILOT_CUSTOM_INSTRUCTIONS_DIRS",
                instructions,
            )
            second = await run.new(text_prompt("append", AWKWARD))
            assert prompt_file.read_text() == "\n" + AWKWARD  # it opens like front matter
            assert spare in copilot.processes(only_copilot=True)
            seen = await run.turns_at_once(first, second)
    assert appended(seen[first], "MARKER-FIRST") and AWKWARD not in seen[first].system_text()
    assert appended(seen[second], AWKWARD) and "MARKER-FIRST" not in seen[second].system_text()
    assert not prompt_file.exists()


async def test_no_copilot_process_outlives_the_client(copilot: CopilotHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with copilot.bridge() as run:
            await run.new(text_prompt("append", "MARKER-A"))
            await run.new(text_prompt("append", "MARKER-B"))
            assert len(copilot.processes(only_copilot=True)) == 3
        # spawn_bridge closed the bridge's stdin and waited for it to exit.
        assert copilot.processes() == []


async def test_verify_passes_every_step_against_real_copilot(
    copilot_binary: Path, tmp_path: Path
) -> None:
    # The preset unpacks copilot into $HOME/.cache/copilot: share the tests' copy instead.
    config = write_verify_config(
        tmp_path / "config.yaml",
        "copilot",
        [str(copilot_binary), "--acp"],
        verify_env={"COPILOT_PKG_CACHE_HOME": str(unpacked_cache())},
    )
    env = isolated_env(tmp_path, without=USER_SETTINGS)
    report = await run_verify("--config", str(config), "--agent", "copilot", env=env, timeout=300)
    report.assert_passed()
    assert not (tmp_path / ".cache" / "copilot").exists()
    # Copilot has no session/fork: that row is skipped, every other one passes.
    assert report.table.count("PASS") == 6 and report.table.count("SKIP") == 1, report.table
