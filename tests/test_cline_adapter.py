"""The cline adapter's part of the pool: a private cline folder with one more rules file.

What cline then puts in its system message, and that no hub daemon is left, is asserted
end to end against the real agent in ``tests/e2e/test_cline.py``.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

# The adapters folder is installed as acp_bridge.adapters through a package-dir mapping,
# which mypy cannot follow.
from acp_bridge.adapters.cline import (  # type: ignore[import-not-found,unused-ignore]
    RULE_FILE,
    ClineAdapter,
)
from adapter_context import ContextWithEnvironment

from acp_bridge.adapter import Delivery
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PrivateDir, PromptRefused
from acp_bridge.registry import AdapterRegistry
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

TEXT = "  ${x} {{y}} $HOME $& @x\n---\n\t \n"
INITIALIZE = {"agentInfo": {"name": "cline", "version": "3.0.65"}}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user whose ``~/.cline`` has rules of its own, hooks and data."""
    cline = tmp_path / "home" / ".cline"
    (cline / "rules").mkdir(parents=True)
    (cline / "rules" / "mine.md").write_text("USER-RULE\n")
    (cline / "hooks").mkdir()
    (cline / "data" / "settings").mkdir(parents=True)
    return tmp_path / "home"


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateDir]:
    directory = PrivateDir.create("acp-bridge-cline-", tmp_path / "private")
    yield directory
    directory.remove()


def adapter_for(environment: dict[str, str]) -> ClineAdapter:
    return ClineAdapter(ContextWithEnvironment(environment))


def test_append_is_a_rules_file_in_a_private_cline_folder_over_the_users_data(
    home: Path, private: PrivateDir
) -> None:
    adapter = adapter_for({"HOME": str(home), "CLINE_SESSION_BACKEND_MODE": "local"})
    config = adapter.process_config(SystemPrompt.of_text("append", TEXT), private)
    assert config.args == ()
    assert config.env == {
        "CLINE_DIR": str(private.path),
        "CLINE_DATA_DIR": str(home / ".cline" / "data"),
        "CLINE_SESSION_BACKEND_MODE": "local",
    }
    rule = private.path / "rules" / RULE_FILE
    assert rule.read_text(encoding="utf-8") == TEXT
    assert stat.S_IMODE(rule.stat().st_mode) == 0o600


def test_the_users_rules_are_copied_and_the_rest_of_the_folder_linked(
    home: Path, private: PrivateDir
) -> None:
    adapter = adapter_for({"HOME": str(home)})
    adapter.process_config(SystemPrompt.of_text("append", "MARKER"), private)
    rules = private.path / "rules"
    # cline skips a linked rule file: the user's own is a copy, readable only by the user.
    copy = rules / "mine.md"
    assert not copy.is_symlink() and copy.read_text() == "USER-RULE\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert (private.path / "hooks").resolve() == (home / ".cline" / "hooks").resolve()
    assert (private.path / "data").is_symlink()
    # Nothing is written into the user's own folder.
    assert sorted(p.name for p in (home / ".cline" / "rules").iterdir()) == ["mine.md"]


def test_the_users_own_cline_dir_and_data_dir_are_the_ones_carried_over(
    tmp_path: Path, private: PrivateDir
) -> None:
    own = tmp_path / "elsewhere"
    (own / "rules").mkdir(parents=True)
    (own / "rules" / "theirs.md").write_text("THEIRS")
    adapter = adapter_for(
        {"HOME": str(tmp_path), "CLINE_DIR": str(own), "CLINE_DATA_DIR": "/data/cline"}
    )
    config = adapter.process_config(SystemPrompt.of_text("append", "MARKER"), private)
    assert config.env["CLINE_DATA_DIR"] == "/data/cline"
    assert (private.path / "rules" / "theirs.md").read_text() == "THEIRS"


def test_a_user_without_a_cline_folder_gets_the_rules_file_alone(
    tmp_path: Path, private: PrivateDir
) -> None:
    adapter = adapter_for({"HOME": str(tmp_path / "nobody")})
    config = adapter.process_config(SystemPrompt.of_text("append", "MARKER"), private)
    assert config.env["CLINE_DATA_DIR"] == str(tmp_path / "nobody" / ".cline" / "data")
    assert [p.name for p in private.path.rglob("*")] == ["rules", RULE_FILE]


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        (SystemPrompt.of_text("override", "MARKER"), "systemPrompt.mode"),
        (SystemPrompt.of_text("append", " \n\t"), "systemPrompt.content"),
        (SystemPrompt.of_text("append", "lone \ud800"), "systemPrompt.content"),
    ],
)
def test_what_cline_cannot_take_is_refused_naming_the_field(
    home: Path, private: PrivateDir, prompt: SystemPrompt, field: str
) -> None:
    with pytest.raises(PromptRefused) as refused:
        adapter_for({"HOME": str(home)}).process_config(prompt, private)
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {"field": field}


def test_cline_is_chosen_by_its_name_and_offers_append_only() -> None:
    adapter = AdapterRegistry().choose(INITIALIZE)
    assert adapter is ClineAdapter
    assert adapter_for({}).delivery(INITIALIZE) == Delivery(append=True, override=False)


def test_a_primary_that_would_start_clines_hub_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        adapter_for({"CLINE_SESSION_BACKEND_MODE": "local"})
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        adapter_for({})
    assert "CLINE_SESSION_BACKEND_MODE=local" in caplog.text


def test_removing_the_private_folder_leaves_the_users_own_folder_whole(
    home: Path, private: PrivateDir
) -> None:
    adapter_for({"HOME": str(home)}).process_config(
        SystemPrompt.of_text("append", "MARKER"), private
    )
    private.remove()
    assert not private.path.exists()
    assert (home / ".cline" / "hooks").is_dir()
    assert (home / ".cline" / "data" / "settings").is_dir()
    assert (home / ".cline" / "rules" / "mine.md").read_text() == "USER-RULE\n"
