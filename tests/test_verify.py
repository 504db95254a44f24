"""``acp-bridge verify``'s own logic: the default-prompt signature and the table."""

from __future__ import annotations

from acp_bridge.verify import DefaultPrompt, Row, format_table, succeeded


def test_default_prompt_share_tells_kept_from_replaced() -> None:
    default = DefaultPrompt.from_text(
        "You are an agent that helps with code.\nshort\nAlways run the tests before you finish.\n"
    )
    assert len(default.lines) == 2  # lines too short to identify the prompt are ignored
    assert (
        default.share_in(
            "You are an agent that helps with code.\n"
            "Always run the tests before you finish.\nMARKER"
        )
        == 1.0
    )
    assert default.share_in("MARKER only") == 0.0


def test_table_lists_every_row_and_fails_on_any_failed_row() -> None:
    rows = [
        Row("session/new", "append", "marker present", "has M", "PASS"),
        Row("fork with its own prompt", "append", "-", "no fork", "SKIP"),
    ]
    table = format_table(rows)
    assert "session/new" in table and "SKIP" in table
    assert "1 passed, 0 failed, 1 skipped" in table
    assert succeeded(rows)
    rows.append(Row("load", "override", "marker present", "no M", "FAIL"))
    assert not succeeded(rows)
    assert not succeeded([])


def test_documented_limit_rows_are_shown_and_do_not_fail_the_run() -> None:
    rows = [
        Row("session/new", "append", "marker present", "has M", "PASS"),
        Row("load, changed prompt", "append", "documented limit: x", "has M", "LIMIT"),
    ]
    table = format_table(rows)
    assert "LIMIT" in table
    assert "1 passed, 0 failed, 0 skipped, 1 at a documented limit of the agent" in table
    assert succeeded(rows)


def test_codex_declares_its_reopen_limits_and_other_adapters_none() -> None:
    from acp_bridge.adapters.codex import CodexAdapter
    from acp_bridge.adapters.goose import GooseAdapter

    from acp_bridge.system_prompt import SystemPrompt

    old = SystemPrompt.of_text("append", "OLD")
    new = SystemPrompt.of_text("append", "NEW")
    assert CodexAdapter.reopen_limits(old, old) == []
    assert CodexAdapter.reopen_limits(old, new)  # developer instructions are fixed at creation
    assert CodexAdapter.reopen_limits(SystemPrompt.of_text("override", "A"), None)
    assert (
        CodexAdapter.reopen_limits(
            SystemPrompt.of_text("override", "A"), SystemPrompt.of_text("override", "B")
        )
        == []
    )
    assert GooseAdapter.reopen_limits(old, new) == []
