"""The copilot adapter's part of the pool: a private custom-instructions directory.

What Copilot then puts in its system message is asserted end to end against the real
agent in ``tests/e2e/test_copilot.py``.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.copilot import (  # type: ignore[import-not-found,unused-ignore]
    CopilotAdapter,
    file_text,
    instruction_dirs,
)
from adapter_context import Context, ContextWithEnvironment

from acp_bridge.adapter import Delivery
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused
from acp_bridge.registry import AdapterRegistry
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

TEXT = "  {{x}} $HOME\n---\n\t \n"
INITIALIZE = {"agentInfo": {"name": "Copilot", "title": "Copilot", "version": "1.0.102"}}


@pytest.fixture
def adapter() -> CopilotAdapter:
    return CopilotAdapter(Context())


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateDir]:
    directory = PrivateDir.create("acp-bridge-copilot-", tmp_path)
    yield directory
    directory.remove()


def test_append_is_an_instructions_file_in_a_listed_private_directory(
    adapter: CopilotAdapter, private: PrivateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COPILOT_CUSTOM_INSTRUCTIONS_DIRS", raising=False)
    config = adapter.process_config(SystemPrompt.of_text("append", TEXT), private)
    assert config.args == ()
    assert config.env == {"COPILOT_CUSTOM_INSTRUCTIONS_DIRS": str(private.path)}
    (path,) = (private.path / ".github" / "instructions").iterdir()
    assert path.name.endswith(".instructions.md")
    assert path.read_text(encoding="utf-8") == TEXT  # no front matter of ours
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (path.parent, path.parent.parent):  # .github/instructions, .github
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_text_that_opens_like_front_matter_is_not_read_as_front_matter(
    adapter: CopilotAdapter, private: PrivateDir
) -> None:
    # Copilot takes a first `---` block naming applyTo as a condition and then lists the
    # file instead of inserting it; one newline before the text keeps it inserted.
    text = "---\napplyTo: nothing\n---\nbody\n"
    adapter.process_config(SystemPrompt.of_text("append", text), private)
    (path,) = (private.path / ".github" / "instructions").iterdir()
    assert path.read_text(encoding="utf-8") == "\n" + text


def test_the_users_own_instruction_directories_stay_listed(
    adapter: CopilotAdapter, private: PrivateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COPILOT_CUSTOM_INSTRUCTIONS_DIRS", "/a,/b")
    config = adapter.process_config(SystemPrompt.of_text("append", TEXT), private)
    assert config.env["COPILOT_CUSTOM_INSTRUCTIONS_DIRS"] == f"/a,/b,{private.path}"
    # Where the relay tells the agent's environment (a preset's env included), that counts.
    told = CopilotAdapter(ContextWithEnvironment({"COPILOT_CUSTOM_INSTRUCTIONS_DIRS": "/c"}))
    other = PrivateDir.create("acp-bridge-copilot-", private.path.parent)
    config = told.process_config(SystemPrompt.of_text("append", TEXT), other)
    assert config.env["COPILOT_CUSTOM_INSTRUCTIONS_DIRS"] == f"/c,{other.path}"
    assert instruction_dirs(" , /a,", "/p") == " /a,/p"
    assert file_text("\ufeff---\n") == "\n\ufeff---\n" and file_text("a\n---") == "a\n---"
    with pytest.raises(PromptRefused, match="comma"):
        instruction_dirs(None, "/tmp/a,b")


def test_override_is_not_offered_and_refused_if_asked(
    adapter: CopilotAdapter, private: PrivateDir
) -> None:
    assert adapter.delivery(INITIALIZE) == Delivery(append=True, override=False)
    with pytest.raises(PromptRefused) as refused:
        adapter.process_config(SystemPrompt.of_text("override", TEXT), private)
    assert refused.value.code == INVALID_PARAMS


def test_a_lone_surrogate_is_refused_not_a_crash(
    adapter: CopilotAdapter, private: PrivateDir
) -> None:
    with pytest.raises(PromptRefused, match="lone surrogate") as refused:
        adapter.process_config(SystemPrompt.of_text("append", "a\udfff"), private)
    assert refused.value.code == INVALID_PARAMS


def test_chosen_automatically_by_the_name_copilot_reports() -> None:
    assert AdapterRegistry().choose({**INITIALIZE, "agentCapabilities": {}}).name == "copilot"
