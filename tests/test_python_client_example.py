"""docs/examples/python_client.py, the README's "From a Python client", run as written:
the ACP Python SDK (agent-client-protocol 0.12.1) in front of the real command line, and
what the model endpoint received in its system field.

Two agents behind the bridge: ``fake_model_agent.py`` (native ``systemPrompt``, an OpenAI
Chat call per turn) and, end to end, claude-agent-acp 0.101.0 (the ``claude`` adapter)."""

from __future__ import annotations

import sys
from pathlib import Path

import agents
import pytest
import trio
from bridge_cli import isolated_env

from acp_bridge.model_endpoint import open_model_endpoint

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "python_client.py"
FAKE_MODEL_AGENT = Path(__file__).with_name("fake_model_agent.py")
TIMEOUT = 180.0


def fake_model_agent(tmp_path: Path, url: str) -> tuple[list[str], dict[str, str], str]:
    command = [sys.executable, str(FAKE_MODEL_AGENT), "--sessions", str(tmp_path / "s.json")]
    return command, {"OPENAI_BASE_URL": url}, "openai-chat"


def claude_agent(tmp_path: Path, url: str) -> tuple[list[str], dict[str, str], str]:
    command = agents.claude_agent_command(*agents.CLAUDE_NATIVE)
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-ant-acp-bridge-test",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return command, env, "anthropic"


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param(fake_model_agent, id="fake-model-agent"),
        pytest.param(claude_agent, id="claude-agent-acp@0.101.0", marks=pytest.mark.e2e),
    ],
)
async def test_the_python_client_example_gets_its_prompt_to_the_model(
    tmp_path: Path, agent: object
) -> None:
    assert callable(agent)
    marker = "PYTHON-SDK-PROMPT-7f3a"
    project = tmp_path / "project"
    project.mkdir()
    async with open_model_endpoint() as endpoint:
        command, agent_env, flavour = await trio.to_thread.run_sync(agent, tmp_path, endpoint.url)
        env = isolated_env(tmp_path / "home", without=("ANTHROPIC_", "OPENAI_"), **agent_env)
        bridge = [sys.executable, "-m", "acp_bridge", "--state", str(tmp_path / "state.db")]
        argv = [sys.executable, str(EXAMPLE), "--prompt", f"{marker}: answer briefly."]
        argv += ["--", *bridge, "--", *command]
        with trio.fail_after(TIMEOUT):
            done = await trio.run_process(
                argv, cwd=project, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
        calls = endpoint.main_requests(flavour)
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()[-4000:]
    assert output.startswith("systemPrompt offered: append and override\n"), output
    if agent is claude_agent:
        assert "acp-bridge model endpoint reply" in output  # the model's answer, streamed back
    assert len(calls) == 1
    system = calls[0].system_text()
    assert f"{marker}: answer briefly." in system
    assert "_meta" not in system and "system_prompt" not in system
