"""``acp-bridge sessions``: what a user sees when listing, showing and forgetting sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from acp_bridge.commands.cli import main
from acp_bridge.commands.sessions_cli import sessions
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.state.store import SessionStore

SECRET = "You are the secret persona Zorblax."
PROMPT = SystemPrompt.of_text("append", SECRET, "Second block.")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "sessions.sqlite3"
    with SessionStore(path) as store:
        store.save("claude", "sess-1", PROMPT)
        store.save("goose", "sess-2", SystemPrompt.of_text("override", "Pirate."), live=False)
        store.save("codex", "sess-3", None, parent_id="sess-9")
        store.save("goose", "shared-id", PROMPT)
        store.save("codex", "shared-id", PROMPT)
    return path


def run(state: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(sessions, ["--state", str(state), *args], input=input)


def test_list_shows_a_table_without_prompt_text(state: Path) -> None:
    result = run(state, "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["AGENT", "SESSION", "ID", "MODE", "LIVE", "UPDATED"]
    rows = [line.split()[:4] for line in lines[1:]]
    assert rows == [
        ["codex", "shared-id", "append", "yes"],
        ["goose", "shared-id", "append", "yes"],
        ["codex", "sess-3", "default", "yes"],
        ["goose", "sess-2", "override", "no"],
        ["claude", "sess-1", "append", "yes"],
    ]
    assert SECRET not in result.output
    assert "Pirate" not in result.output


def test_list_filters_by_agent(state: Path) -> None:
    result = run(state, "list", "--agent", "goose")
    assert result.exit_code == 0
    assert [line.split()[1] for line in result.output.splitlines()[1:]] == ["shared-id", "sess-2"]


def test_list_json_has_no_prompt_text(state: Path) -> None:
    result = run(state, "list", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert len(data) == 5
    claude = next(item for item in data if item["agent"] == "claude")
    assert claude["sessionId"] == "sess-1"
    assert claude["mode"] == "append"
    assert claude["live"] is True
    assert claude["fingerprint"] == PROMPT.fingerprint()
    assert claude["updatedAt"].endswith("+00:00")
    assert SECRET not in result.output


def test_list_without_a_database_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "sessions.sqlite3"
    result = run(missing, "list")
    assert result.exit_code == 0
    assert result.output == "No stored sessions.\n"
    assert json.loads(run(missing, "list", "--json").output) == []
    assert not missing.parent.exists()


def test_default_state_is_under_xdg_state_home(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    default = SessionStore.default_path()
    default.parent.mkdir(parents=True)
    default.write_bytes(state.read_bytes())
    result = CliRunner().invoke(sessions, ["list", "--agent", "claude"])
    assert result.exit_code == 0
    assert "sess-1" in result.output


def test_show_hides_the_prompt_unless_asked(state: Path) -> None:
    result = run(state, "show", "sess-1")
    assert result.exit_code == 0, result.output
    assert "agent:" in result.output and "claude" in result.output
    assert "mode:" in result.output and "append" in result.output
    assert PROMPT.fingerprint() in result.output
    assert SECRET not in result.output

    shown = run(state, "show", "sess-1", "--prompt")
    assert shown.exit_code == 0
    assert shown.output.endswith(f"\n\n{SECRET}\n\nSecond block.\n")


def test_show_json_includes_the_wire_prompt_only_with_prompt(state: Path) -> None:
    plain = json.loads(run(state, "show", "sess-2", "--json").output)
    assert "prompt" not in plain
    assert plain["live"] is False
    full = json.loads(run(state, "show", "sess-2", "--json", "--prompt").output)
    assert full["prompt"] == {"mode": "override", "content": [{"type": "text", "text": "Pirate."}]}


def test_show_session_with_agent_default_prompt(state: Path) -> None:
    result = run(state, "show", "sess-3", "--prompt")
    assert result.exit_code == 0
    assert "default" in result.output
    assert "sess-9" in result.output


def test_show_unknown_session_is_an_error(state: Path) -> None:
    result = run(state, "show", "nope")
    assert result.exit_code == 1
    assert "No stored session nope." in result.output


def test_ambiguous_id_needs_agent(state: Path) -> None:
    result = run(state, "show", "shared-id")
    assert result.exit_code == 1
    assert "several agents (codex, goose)" in result.output
    assert "--agent" in result.output
    chosen = run(state, "show", "shared-id", "--agent", "goose")
    assert chosen.exit_code == 0
    assert "goose" in chosen.output


def test_forget_one_session(state: Path) -> None:
    result = run(state, "forget", "sess-1")
    assert result.exit_code == 0
    assert "Forgot session sess-1 of claude." in result.output
    with SessionStore(state) as store:
        assert store.get("claude", "sess-1") is None
        assert len(store.list()) == 4


def test_forget_ambiguous_or_unknown_session_changes_nothing(state: Path) -> None:
    assert run(state, "forget", "shared-id").exit_code == 1
    unknown = run(state, "forget", "sess-1", "--agent", "goose")
    assert unknown.exit_code == 1
    assert "No stored session sess-1 of goose." in unknown.output
    with SessionStore(state) as store:
        assert len(store.list()) == 5


def test_forget_all_of_one_agent_with_yes(state: Path) -> None:
    result = run(state, "forget", "--all", "--agent", "goose", "--yes")
    assert result.exit_code == 0
    assert "Forgot 2 session(s) of goose." in result.output
    with SessionStore(state) as store:
        assert {r.agent for r in store.list()} == {"claude", "codex"}


def test_forget_all_asks_first(state: Path) -> None:
    declined = run(state, "forget", "--all", input="n\n")
    assert declined.exit_code == 1
    assert "Forget 5 stored session(s)?" in declined.output
    with SessionStore(state) as store:
        assert len(store.list()) == 5
    accepted = run(state, "forget", "--all", input="y\n")
    assert accepted.exit_code == 0
    with SessionStore(state) as store:
        assert store.list() == []


def test_forget_needs_exactly_one_of_id_or_all(state: Path) -> None:
    assert run(state, "forget").exit_code == 2
    assert run(state, "forget", "sess-1", "--all").exit_code == 2


def test_broken_database_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "sessions.sqlite3"
    broken.write_bytes(b"garbage" * 100)
    result = run(broken, "list")
    assert result.exit_code == 1
    assert str(broken) in result.output


def test_without_state_the_configured_bridge_state_is_listed(state: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"bridge:\n  state: {json.dumps(str(state))}\n")
    result = CliRunner().invoke(sessions, ["--config", str(config), "list", "--json"])
    assert result.exit_code == 0, result.output
    assert {entry["sessionId"] for entry in json.loads(result.output)}


def test_a_broken_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("bridge:\n  stat: nowhere\n")
    result = CliRunner().invoke(sessions, ["--config", str(config), "list"])
    assert result.exit_code == 1
    assert "bridge.stat" in result.output


def show_through_the_command_line(state: Path, session_id: str) -> str:
    """``acp-bridge sessions --state STATE show ID`` from the top of the command line (click's
    runner, in this process): what it prints."""
    command = ["sessions", "--state", str(state), "show", session_id]
    done = CliRunner().invoke(main, command, prog_name="acp-bridge")
    assert done.exit_code == 0, done.stderr
    return done.stdout


def test_show_claims_nothing_about_turns_for_a_prompt_delivered_another_way(
    state: Path,
) -> None:
    # claude takes the prompt on session/new: the store records no user-turn delivery,
    # and the prompt did reach the model.
    shown = show_through_the_command_line(state, "sess-1")
    assert "in conversation" not in shown and "user turn" not in shown, shown


def test_show_says_when_first_turn_put_the_prompt_in_a_user_turn(state: Path) -> None:
    with SessionStore(state) as store:
        store.save("first-turn-agent", "sess-ft", PROMPT)
        store.set_delivered("first-turn-agent", "sess-ft", PROMPT.fingerprint())
        store.save("first-turn-agent", "sess-changed", PROMPT)
        store.set_delivered("first-turn-agent", "sess-changed", "an-earlier-fingerprint")
    assert "in a user turn: yes\n" in show_through_the_command_line(state, "sess-ft")
    changed = show_through_the_command_line(state, "sess-changed")
    assert "in a user turn: an earlier prompt; this one goes with the next turn\n" in changed
