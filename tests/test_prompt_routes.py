"""What the route each pooled adapter gives a prompt (an argument, the environment, a
private file) can carry: a NUL character (U+0000) is valid JSON text, but no argument or
environment string of a process can hold one (``execve`` takes C strings).

Each adapter either carries such a prompt (in a file, or escaped) or the pool refuses it
with ``-32602`` naming the block, before any process is started.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.codex import CodexAdapter  # type: ignore[import-not-found,unused-ignore]
from acp_bridge.adapters.copilot import (  # type: ignore[import-not-found,unused-ignore]
    CopilotAdapter,
)
from acp_bridge.adapters.gemini import GeminiAdapter  # type: ignore[import-not-found,unused-ignore]
from acp_bridge.adapters.opencode import (  # type: ignore[import-not-found,unused-ignore]
    OpencodeAdapter,
)
from acp_bridge.adapters.qwen import QwenAdapter  # type: ignore[import-not-found,unused-ignore]
from adapter_context import ContextWithEnvironment

from acp_bridge.core.system_prompt import Mode, SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused, check_process_config
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

NUL_TEXT = "before\x00after"
PROMPT_BLOCKS = ("Be brief.", NUL_TEXT)

# (adapter, mode) -> the field a refusal names; absent: the prompt is carried.
REFUSED = {
    # qwen reads an appended prompt only from its command line.
    (QwenAdapter, "append"): "systemPrompt.content[1].text",
    # copilot has no override route at all (refused for the mode, NUL or not).
    (CopilotAdapter, "override"): "systemPrompt.mode",
}
ADAPTERS = (CodexAdapter, GeminiAdapter, QwenAdapter, OpencodeAdapter, CopilotAdapter)


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateDir]:
    directory = PrivateDir.create("acp-bridge-test-", tmp_path / "private")
    yield directory
    directory.remove()


def carried_in(text: str, haystack: str) -> bool:
    """Whether ``haystack`` holds ``text`` as it is or in JSON/TOML's ``\\u0000`` escape."""
    return text in haystack or json.dumps(text)[1:-1] in haystack


@pytest.mark.parametrize("mode", ["append", "override"])
@pytest.mark.parametrize("adapter_class", ADAPTERS, ids=lambda c: c.name)
def test_a_nul_in_a_prompt_is_carried_or_refused_naming_its_block(
    adapter_class: Any, mode: Mode, private: PrivateDir, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    adapter = adapter_class(ContextWithEnvironment({"HOME": str(home), "PATH": "/usr/bin"}))
    prompt = SystemPrompt.of_text(mode, *PROMPT_BLOCKS)
    refused_field = REFUSED.get((adapter_class, mode))
    try:
        config = adapter.process_config(prompt, private)
        check_process_config(config, prompt, adapter.agent_label)
    except PromptRefused as exc:
        assert refused_field is not None, f"refused: {exc}"
        assert exc.code == INVALID_PARAMS
        assert exc.data == {"field": refused_field}
        return
    assert refused_field is None, "a prompt the agent cannot receive was not refused"
    strings = [*config.args, *config.env, *config.env.values()]
    assert not any("\x00" in value for value in strings)
    files = [p.read_text(encoding="utf-8") for p in private.path.rglob("*") if p.is_file()]
    assert any(carried_in(NUL_TEXT, text) for text in [*config.args, *files])


def test_a_process_config_the_os_cannot_start_is_refused_naming_the_block() -> None:
    prompt = SystemPrompt.of_text("append", "one", "two", "th\x00ree")
    config_args = QwenAdapter(ContextWithEnvironment({})).process_config(
        prompt, PrivateDir(Path("/nonexistent"))
    )
    with pytest.raises(PromptRefused) as caught:
        check_process_config(config_args, prompt, "qwen")
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"field": "systemPrompt.content[2].text"}
    assert "NUL" in str(caught.value) and "command line" in str(caught.value)
