"""The gemini and qwen adapters' pure parts: how a prompt becomes a process."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.gemini import (  # type: ignore[import-not-found,unused-ignore]
    APPEND_FILE,
    GeminiAdapter,
    merged_settings,
    protect_placeholders,
)
from acp_bridge.adapters.qwen import QwenAdapter  # type: ignore[import-not-found,unused-ignore]

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused
from acp_bridge.registry import AdapterRegistry


def test_agents_are_chosen_by_their_agent_info_name() -> None:
    registry = AdapterRegistry()
    gemini = {"agentInfo": {"name": "gemini-cli", "version": "0.61.0"}}
    qwen = {"agentInfo": {"name": "qwen-code", "version": "0.24.4"}}
    assert registry.choose(gemini) is GeminiAdapter
    assert registry.choose(qwen) is QwenAdapter


def test_only_what_gemini_substitutes_is_protected() -> None:
    text = "${AvailableTools} ${AgentSkills} ${SubAgents} ${read_file_ToolName} ${HOME} $HOME {{x}}"
    protected = protect_placeholders(text)
    assert protected == (
        "$\u2060{AvailableTools} $\u2060{AgentSkills} $\u2060{SubAgents} "
        "$\u2060{read_file_ToolName} ${HOME} $HOME {{x}}"
    )


def test_settings_carry_the_users_own_and_add_the_bridge_context_file(tmp_path: Path) -> None:
    user = tmp_path / "settings.json"
    assert merged_settings(user) == {
        "context": {"fileName": ["GEMINI.md", APPEND_FILE], "importFormat": "flat"}
    }
    user.write_text(json.dumps({"ui": {"theme": "x"}, "context": {"fileName": "AGENTS.md"}}))
    assert merged_settings(user) == {
        "ui": {"theme": "x"},
        "context": {"fileName": ["AGENTS.md", APPEND_FILE], "importFormat": "flat"},
    }
    user.write_text("{ // a comment\n}")
    with pytest.raises(PromptRefused, match="cannot carry"):
        merged_settings(user)


class KnownEnvironment:
    """The part of an AdapterContext that says the agent's environment."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = environment

    def agent_environment(self) -> dict[str, str]:
        return self.environment


def test_gemini_append_home_links_the_users_files(tmp_path: Path) -> None:
    user_home = tmp_path / "user"
    (user_home / ".gemini").mkdir(parents=True)
    (user_home / ".gemini" / "oauth_creds.json").write_text("{}")
    adapter = GeminiAdapter.__new__(GeminiAdapter)
    # The agent's HOME (e.g. configured for the agent), not the bridge's own.
    adapter.context = KnownEnvironment({"HOME": str(user_home)})  # type: ignore[assignment,unused-ignore]
    private = PrivateDir.create("t-", tmp_path / "private")
    config = adapter.process_config(SystemPrompt.of_text("append", "@x\nrules"), private)
    home = Path(config.env["GEMINI_CLI_HOME"])
    assert config.args == ()
    assert (home / ".gemini" / "oauth_creds.json").resolve() == (
        user_home / ".gemini" / "oauth_creds.json"
    )
    prompt_file = home / ".gemini" / APPEND_FILE
    assert prompt_file.read_text() == "@x\nrules"
    assert stat.S_IMODE(prompt_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in (user_home / ".gemini").iterdir()) == ["oauth_creds.json"]


def test_override_text_goes_to_a_file_never_to_argv(tmp_path: Path) -> None:
    private = PrivateDir.create("t-", tmp_path)
    gemini = GeminiAdapter.__new__(GeminiAdapter)
    config = gemini.process_config(SystemPrompt.of_text("override", "SECRET ${SubAgents}"), private)
    assert Path(config.env["GEMINI_SYSTEM_MD"]).read_text() == "SECRET $\u2060{SubAgents}"
    qwen = QwenAdapter.__new__(QwenAdapter)
    private = PrivateDir.create("t-", tmp_path)
    config = qwen.process_config(SystemPrompt.of_text("override", "  SECRET\n"), private)
    assert Path(config.env["QWEN_SYSTEM_MD"]).read_text() == "  SECRET\n"
    assert config.args == ()


def test_qwen_append_is_one_argument_that_cannot_be_read_as_an_option() -> None:
    qwen = QwenAdapter.__new__(QwenAdapter)
    private = PrivateDir(Path("/nonexistent"))
    config = qwen.process_config(SystemPrompt.of_text("append", "--help"), private)
    assert list(config.args) == ["--append-system-prompt=--help"]
    with pytest.raises(PromptRefused):
        qwen.process_config(SystemPrompt.of_text("append", "  \n"), private)


def test_gemini_0_61_declares_its_broken_session_load_and_nothing_else_does() -> None:
    measured = {"agentInfo": {"name": "gemini-cli", "version": "0.61.0"}}
    assert list(GeminiAdapter.broken_methods(measured)) == ["session/load"]
    other = {"agentInfo": {"name": "gemini-cli", "version": "0.62.0"}}
    assert GeminiAdapter.broken_methods(other) == {}
    assert QwenAdapter.broken_methods({"agentInfo": {"name": "qwen-code"}}) == {}
