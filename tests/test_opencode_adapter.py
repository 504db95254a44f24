"""The opencode adapter's part of the pool: how a prompt becomes a private config file.

What opencode then does with that file is asserted end to end against the real agent in
``tests/e2e/test_opencode.py``; here: the JSON text survives opencode's ``{env:}`` /
``{file:}`` substitution, the files are private, and prompts opencode cannot take are
refused with a clear error.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.opencode import (  # type: ignore[import-not-found,unused-ignore]
    OpencodeAdapter,
    config_json,
)
from adapter_context import Context, ContextWithEnvironment

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused
from acp_bridge.registry import AdapterRegistry
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

NASTY = (
    "---\ntitle: x\n---\n  {env:HOME} {file:/etc/hostname} {{x}} $HOME $& "
    "\\u007b é \U0001f600\n\t \n"
)


@pytest.fixture
def adapter() -> OpencodeAdapter:
    return OpencodeAdapter(Context())


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateDir]:
    directory = PrivateDir.create("acp-bridge-opencode-", tmp_path)
    yield directory
    directory.remove()


def substituted(text: str) -> str:
    """What opencode 1.18 does to config text before parsing it (env, then file)."""
    text = re.sub(r"\{env:([^}]+)\}", "SUBSTITUTED", text)
    return re.sub(r"\{file:[^}]+\}", "SUBSTITUTED", text)


def test_config_text_passes_opencodes_substitution_unchanged() -> None:
    value = {"agent": {"build": {"prompt": NASTY}}, "instructions": ["/a/{env:X}.md"]}
    text = config_json(value)
    assert substituted(text) == text
    assert json.loads(text) == value
    assert text.isascii()


def test_config_text_keeps_a_lone_surrogate_valid() -> None:
    text = config_json({"prompt": "a\ud800b"})
    assert text.isascii() and json.loads(text) == {"prompt": "a\ud800b"}


def test_override_sets_the_prompt_of_the_primary_agents_only(
    adapter: OpencodeAdapter, private: PrivateDir
) -> None:
    config = adapter.process_config(SystemPrompt.of_text("override", NASTY), private)
    assert config.args == ()
    path = Path(config.env["OPENCODE_CONFIG"])
    assert path.parent == private.path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "agent": {"build": {"prompt": NASTY}, "plan": {"prompt": NASTY}}
    }


def test_append_names_a_private_instructions_file(
    adapter: OpencodeAdapter, private: PrivateDir
) -> None:
    config = adapter.process_config(SystemPrompt.of_text("append", NASTY), private)
    loaded = json.loads(Path(config.env["OPENCODE_CONFIG"]).read_text())
    (instructions,) = loaded["instructions"]
    assert set(loaded) == {"instructions"}
    assert Path(instructions).parent == private.path
    assert Path(instructions).read_text(encoding="utf-8") == NASTY
    assert stat.S_IMODE(Path(instructions).stat().st_mode) == 0o600


def test_prompts_opencode_cannot_take_are_refused(
    adapter: OpencodeAdapter, private: PrivateDir
) -> None:
    with pytest.raises(PromptRefused, match="empty override") as empty:
        adapter.process_config(SystemPrompt.of_text("override", ""), private)
    with pytest.raises(PromptRefused, match="lone surrogate") as surrogate:
        adapter.process_config(SystemPrompt.of_text("append", "a\ud800"), private)
    for refused in (empty.value, surrogate.value):
        assert refused.code == INVALID_PARAMS
        assert refused.data == {"field": "systemPrompt.content"}
    # Whitespace is a prompt like any other: opencode uses it as sent.
    adapter.process_config(SystemPrompt.of_text("override", "  "), private)


def test_a_users_own_opencode_config_variable_is_not_replaced(
    adapter: OpencodeAdapter, private: PrivateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENCODE_CONFIG", "/home/me/opencode.json")
    with pytest.raises(PromptRefused, match="already set"):
        adapter.process_config(SystemPrompt.of_text("append", "x"), private)
    # Where the relay tells the agent's environment (a preset's env included), that counts.
    monkeypatch.delenv("OPENCODE_CONFIG")
    told = OpencodeAdapter(ContextWithEnvironment({"OPENCODE_CONFIG": "/preset.json"}))
    with pytest.raises(PromptRefused, match="preset"):
        told.process_config(SystemPrompt.of_text("append", "x"), private)


def test_chosen_automatically_by_the_name_opencode_reports() -> None:
    result = {"agentInfo": {"name": "OpenCode", "version": "1.18.33"}, "agentCapabilities": {}}
    assert AdapterRegistry().choose(result).name == "opencode"
