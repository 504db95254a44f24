"""Kilo 7.7.9 through the bridge, end to end, against the embedded model endpoint.

The real Kilo binary (npm ``@kilocode/cli-linux-x64``, cached by ``tests/agents.py``) runs
behind the real bridge command line (``python -m acp_bridge --state FILE -- kilo acp``)
with an isolated HOME and a provider, named in ``KILO_CONFIG_CONTENT``, that speaks Chat
Completions to the endpoint. The npm registry is an unreachable local port, so Kilo's
own plugin install stays offline. The test picks each turn's request by its user text.

Kilo's ``initialize`` takes seconds per process, so each test does as much as its
lifetimes allow: one connection with several prompts, one restart.
"""

from __future__ import annotations

import json
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

TIMEOUT = 300.0
KILO_DEFAULT_START = "You are Kilo,"
# What Kilo substitutes in an instructions file ({env:…}, {file:…}, not on a `//` line),
# templates of other agents, and whitespace at both ends.
AWKWARD = (
    "  {env:HOME} {file:/etc/hostname} ${env:HOME} {{x}} ${HOME} $& \\u007b é\n"
    "// {env:HOME}\n{\n\t  \n"
)
# The user's own Kilo settings of the machine running the tests.
USER_SETTINGS = ("KILO_",)
# An unreachable npm registry: Kilo's own plugin install stays offline.
OFFLINE_REGISTRY = {"npm_config_registry": "http://127.0.0.1:9/"}
USER_INSTRUCTIONS = "USER-INSTRUCTIONS"
# What Kilo 7.7.9 advertises itself (measured).
KILO_SESSION_CAPABILITIES: dict[str, object] = {"close": {}, "fork": {}, "list": {}, "resume": {}}


class KiloHome(AgentHome):
    """An isolated Kilo user: HOME, XDG dirs, its session database."""

    def env(self) -> dict[str, str]:
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": f"{self.endpoint.url}/v1", "apiKey": "sk-fake"},
            "models": {"fake-model": {}},
        }
        own = self.root / "mine.md"
        own.write_text(USER_INSTRUCTIONS)
        config = {
            "instructions": [str(own)],
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "autoupdate": False,
            "share": "disabled",
            "provider": {"fake": provider},
        }
        settings = {
            "KILO_CONFIG_CONTENT": json.dumps(config),
            "KILO_DISABLE_MODELS_FETCH": "1",
            "KILO_DISABLE_AUTOUPDATE": "1",
            "KILO_DISABLE_LSP_DOWNLOAD": "1",
            **OFFLINE_REGISTRY,
        }
        return self.agent_env(USER_SETTINGS, settings)

    def agent_argv(self) -> list[str]:
        return [str(self.binary), "acp"]

    def processes(self, *, only_kilo: bool = False) -> list[int]:
        """Live processes of this home (found by their environment): the bridge, Kilo and
        anything started for it (``only_kilo``: the Kilo processes)."""
        argv0 = str(self.binary) if only_kilo else None
        return live_processes(f"HOME={self.home}", argv0=argv0)


@pytest.fixture(scope="session")
def kilo_binary() -> Path:
    return agents.kilo_binary()


@pytest.fixture
async def kilo(kilo_binary: Path, tmp_path: Path) -> AsyncIterator[KiloHome]:
    async with open_agent_home(KiloHome, kilo_binary, tmp_path) as home:
        yield home
    assert home.processes() == []


def appended(request: RecordedRequest, text: str) -> bool:
    """``text`` arrived whole as Kilo's instructions entry, after its own prompt."""
    (system,) = request.system_blocks()
    return system.startswith(KILO_DEFAULT_START) and f"system-prompt.md\n{text}\n" in system


async def test_each_prompt_reaches_its_own_sessions_verbatim(kilo: KiloHome) -> None:
    with trio.fail_after(TIMEOUT):
        async with kilo.bridge() as run:
            with pytest.raises(ClientRequestError) as refused:
                await run.new(text_prompt("override", "MARKER-O"))
            plain = await run.new()
            first = await run.new(text_prompt("append", "MARKER-ONE"))
            second = await run.new(text_prompt("append", AWKWARD))
            assert len(kilo.processes(only_kilo=True)) == 3
            seen = await run.turns_at_once(plain, first, second)
            listed = await run.client.request("session/list", {"cwd": kilo.cwd})
        assert kilo.processes() == []
    capabilities = run.initialize["agentCapabilities"]
    # Exactly what is delivered: append, on top of what Kilo offers itself.
    assert capabilities["sessionCapabilities"] == {
        **KILO_SESSION_CAPABILITIES,
        "systemPrompt": {},
    }
    assert refused.value.code == -32602
    assert seen[plain].system_text().startswith(KILO_DEFAULT_START)
    assert "MARKER" not in seen[plain].system_text() and "system-prompt.md" not in str(
        seen[plain].system_blocks()
    )
    assert appended(seen[first], "MARKER-ONE") and AWKWARD not in seen[first].system_text()
    # {env:HOME} and {file:…} reach the model as sent, not substituted.
    assert appended(seen[second], AWKWARD) and "MARKER-ONE" not in seen[second].system_text()
    # The user's own instructions (in KILO_CONFIG_CONTENT) stay under the bridge's layer.
    assert all(USER_INSTRUCTIONS in request.system_text() for request in seen.values())
    # Every process shares the user's session database: one list has them all.
    assert {plain, first, second} <= {s["sessionId"] for s in listed["sessions"]}


async def test_a_spare_process_serves_the_next_prompt_with_its_text(kilo: KiloHome) -> None:
    config = kilo.root / "spare.yaml"
    config.write_text("bridge:\n  adapter_options:\n    kilo: {spare: true}\n")

    def pids() -> list[int]:
        return kilo.processes(only_kilo=True)

    with trio.fail_after(TIMEOUT * 2):
        async with kilo.bridge("--config", str(config)) as run:
            first = await run.new(text_prompt("append", "MARKER-FIRST"))
            # Started and initialized with its configuration layer naming an instructions
            # file that does not exist yet.
            spare, instructions = await wait_for_spare(pids, "KILO_CONFIG", "../system-prompt.md")
            assert (instructions.parent / "kilo.json").is_file()
            second = await run.new(text_prompt("append", AWKWARD))
            assert instructions.is_file()
            assert spare in pids()
            seen = await run.turns_at_once(first, second)
    assert appended(seen[first], "MARKER-FIRST") and AWKWARD not in seen[first].system_text()
    assert appended(seen[second], AWKWARD) and "MARKER-FIRST" not in seen[second].system_text()
    assert not instructions.exists()


async def test_resume_after_a_bridge_restart_keeps_the_sessions_prompt(kilo: KiloHome) -> None:
    with trio.fail_after(TIMEOUT * 2):
        async with kilo.bridge() as run:
            session = await run.new(text_prompt("append", AWKWARD))
            await run.turn(session)
        assert kilo.processes() == []
        # An editor restart: the prompt is omitted on resume and the bridge keeps it.
        async with kilo.bridge() as run:
            await run.reopen("session/resume", session)
            again = await run.turn(session)
    assert appended(again, AWKWARD)
    assert again.user_texts()[0] != again.last_user_text()  # history kept


async def test_verify_passes_every_step_against_real_kilo(
    kilo_binary: Path, tmp_path: Path
) -> None:
    config = write_verify_config(tmp_path / "config.yaml", "kilo", [str(kilo_binary), "acp"])
    env = isolated_env(tmp_path, without=USER_SETTINGS, **OFFLINE_REGISTRY)
    report = await run_verify("--config", str(config), "--agent", "kilo", env=env, timeout=1200)
    report.assert_passed()
    assert live_processes(f"HOME={tmp_path}") == []
    # Append only: every append row passes, override is not offered.
    assert report.table.count("PASS") == 7 and "FAIL" not in report.table, report.table
