"""``acp-bridge verify``: the default-prompt signature, the table, documented limits
(LIMIT only when the model received what the adapter says), and a quiet stderr."""

from __future__ import annotations

import json
import os
import re
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import preloaded
import pytest
import trio
from conftest import VerifyReport
from memory_agent import FAKE_PYTHON

from acp_bridge.commands import verify
from acp_bridge.commands.verify import STDERR_TAIL, DefaultPrompt, Row, format_table, succeeded


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

    from acp_bridge.core.system_prompt import SystemPrompt

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


# ------------------------------------------------------------------------------------
# verify against tests/fake_model_agent.py: a native agent that calls the model endpoint

FAKE_MODEL_AGENT = Path(__file__).with_name("fake_model_agent.py")

PINNED_ADAPTER = textwrap.dedent(
    '''
    """Native delivery for an agent that keeps a session's first prompt on reopen."""

    from acp_bridge.adapter import ReopenLimit
    from acp_bridge.adapters.native import NativeAdapter


    class PinnedAdapter(NativeAdapter):
        name = "pinned"

        @classmethod
        def reopen_limits(cls, previous, prompt):
            if previous is None or (
                prompt is not None and prompt.fingerprint() == previous.fingerprint()
            ):
                return []
            if PLAIN:  # the older form: a sentence only
                return ["this agent keeps a session's first prompt"]
            return [
                ReopenLimit(
                    "this agent keeps a session's first prompt",
                    receives=(previous,),
                    misses=(prompt,) if prompt is not None else (),
                )
            ]
    '''
)


def verify_args(tmp_path: Path, *agent_args: str, adapter: str | None = None) -> list[str]:
    args = ["--endpoint", "openai-chat", "--env", "OPENAI_BASE_URL=${ENDPOINT_URL}"]
    if adapter is not None:
        args += ["--config", str(tmp_path / "config.yaml"), "--adapter", adapter]
    sessions = tmp_path / "agent-sessions.json"
    return [
        *args,
        "--",
        *FAKE_PYTHON,
        str(FAKE_MODEL_AGENT),
        "--sessions",
        str(sessions),
        *agent_args,
    ]


def user_adapter(tmp_path: Path, *, plain: bool) -> None:
    folder = tmp_path / "adapters"
    folder.mkdir()
    (folder / "pinned.py").write_text(f"PLAIN = {plain}\n" + PINNED_ADAPTER)
    (tmp_path / "config.yaml").write_text(f"bridge:\n  adapter_paths: [{str(folder)!r}]\n")


def private_tmp(tmp_path: Path) -> dict[str, str]:
    """The environment with TMPDIR in the test's folder: verify's files end up there."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


@pytest.fixture
def verify_here(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., VerifyReport]:
    """``acp-bridge verify ARGS`` run by the command itself in this process, TMPDIR in the
    test's folder: the table it prints on stdout, the progress it writes to fd 2 and its
    exit status, as from :func:`run_verify`, without an interpreter of its own to start
    and load the bridge (the agent is still a process, its stderr still fd 2's). The tests
    of the agent's stderr run the command as a process."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again

    def run(*args: str) -> VerifyReport:
        capfd.readouterr()
        try:
            verify.command().main(list(args), prog_name="acp-bridge verify")
        except SystemExit as exit:
            status = exit.code
        else:
            status = 0
        out, err = capfd.readouterr()
        assert isinstance(status, int), status
        return VerifyReport(status, out, err)

    return run


async def run_verify(*args: str, env: dict[str, str], timeout: float) -> VerifyReport:
    """``python -m acp_bridge verify ARGS`` as a process of its own, whose stderr the tests
    of the agent's stderr read; forked from one that has imported the bridge
    (``preloaded``): what comes after the interpreter's start is the same."""
    with trio.fail_after(timeout):
        ran = await preloaded.run(["verify", *args], env=env)
    return VerifyReport(ran.returncode, ran.stdout.decode(), ran.stderr.decode())


def agent_log_path(stderr: str) -> Path:
    match = re.search(r"the agent's stderr (?:goes to|is in) (\S+)", stderr)
    assert match is not None, stderr
    return Path(match[1])


def rows_of(table: str, step: str) -> list[str]:
    """The rows of ``step``: the line that starts one (it ends with the result) and its
    continuation lines (indented), joined with newlines."""
    rows: list[list[str]] = []
    current: list[str] | None = None
    for line in table.splitlines():
        if line.startswith(step):
            current = [line]
            rows.append(current)
        elif current is not None and line.startswith(" ") and line.strip():
            current.append(line)
        else:
            current = None
    return ["\n".join(row) for row in rows]


def status_of(row: str) -> str:
    return row.splitlines()[0].split()[-1]


def text_of(row: str) -> str:
    """A row's words without its result, continuation lines joined on."""
    first, _, rest = row.partition("\n")
    return " ".join(first.split()[:-1] + rest.split())


CHANGED = "load of a live session, changed prompt"
DEFAULT = "load after restart, omitted (default)"


def test_verify_passes_every_row_for_an_agent_that_applies_every_prompt(
    tmp_path: Path, verify_here: Callable[..., VerifyReport]
) -> None:
    report = verify_here(*verify_args(tmp_path))
    report.assert_passed()
    assert "13 passed, 0 failed, 0 skipped" in report.table
    assert max(len(line) for line in report.table.splitlines()) <= 100, report.table
    # The markers' own text is long; the table names them by their role in the step.
    assert "ACPBRIDGE-" not in report.table and "has marker" in report.table, report.table


def test_verify_fails_an_agent_that_pins_the_first_prompt(
    tmp_path: Path, verify_here: Callable[..., VerifyReport]
) -> None:
    report = verify_here(*verify_args(tmp_path, "--pin"))
    assert report.returncode == 1
    for step in (CHANGED, DEFAULT):
        assert [status_of(row) for row in rows_of(report.table, step)] == ["FAIL", "FAIL"]


@pytest.mark.parametrize("plain", [False, True], ids=["ReopenLimit", "plain-sentence"])
def test_a_declared_limit_reads_limit_when_the_model_got_what_it_says(
    tmp_path: Path, plain: bool, verify_here: Callable[..., VerifyReport]
) -> None:
    user_adapter(tmp_path, plain=plain)
    report = verify_here(*verify_args(tmp_path, "--pin", adapter="pinned"))
    report.assert_passed()
    for step in (CHANGED, DEFAULT):
        rows = rows_of(report.table, step)
        assert [status_of(row) for row in rows] == ["LIMIT", "LIMIT"], report.table
        assert all("keeps a session's first prompt" in text_of(row) for row in rows)
    assert "9 passed, 0 failed, 0 skipped, 4 at a documented limit" in report.table


@pytest.mark.parametrize("plain", [False, True], ids=["ReopenLimit", "plain-sentence"])
def test_a_declared_limit_fails_when_the_model_got_something_else(
    tmp_path: Path, plain: bool, verify_here: Callable[..., VerifyReport]
) -> None:
    # The agent applies every change, so "the first prompt is still there" is not what
    # the model received: the limit rows must fail, whatever else passed.
    user_adapter(tmp_path, plain=plain)
    report = verify_here(*verify_args(tmp_path, adapter="pinned"))
    assert report.returncode == 1
    for step in (CHANGED, DEFAULT):
        assert [status_of(row) for row in rows_of(report.table, step)] == ["FAIL", "FAIL"]
    assert "LIMIT" not in report.table.splitlines()[-1]


async def test_verify_keeps_the_agent_stderr_in_a_file_and_stderr_short(tmp_path: Path) -> None:
    report = await run_verify(
        "--keep-home",
        *verify_args(tmp_path, "--noise", "30"),
        env=private_tmp(tmp_path),
        timeout=60,
    )
    report.assert_passed()
    assert report.table.splitlines()[0].split() == [
        "step",
        "mode",
        "expected",
        "/",
        "observed",
        "result",
    ]
    assert "fake-model-agent DEBUG" not in report.table + report.stderr
    assert len(report.stderr.splitlines()) <= 20, report.stderr
    log = agent_log_path(report.stderr)
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.read_text().count("fake-model-agent DEBUG") >= 30 * 20
    # The home is kept too, and stays once verify and its watchdogs have ended.
    kept = re.search(r"\] kept (\S+)", report.stderr)
    assert kept is not None, report.stderr
    assert Path(kept[1]).is_dir() and Path(kept[1]).stat().st_mode & 0o777 == 0o700


async def test_a_passing_verify_leaves_no_stderr_file_behind(tmp_path: Path) -> None:
    report = await run_verify(
        *verify_args(tmp_path, "--noise", "3"), env=private_tmp(tmp_path), timeout=60
    )
    report.assert_passed()
    assert not agent_log_path(report.stderr).exists()
    assert not list(tmp_path.glob("acp-bridge-verify-*"))


async def test_verify_shows_the_agent_stderr_tail_under_a_failing_row(tmp_path: Path) -> None:
    report = await run_verify(
        *verify_args(tmp_path, "--pin", "--noise", "30"), env=private_tmp(tmp_path), timeout=60
    )
    assert report.returncode == 1
    stderr = report.stderr.splitlines()
    failing = [i for i, line in enumerate(stderr) if f"FAIL {CHANGED} [append]" in line]
    assert failing
    tail = stderr[failing[0] + 1 : failing[0] + 2 + STDERR_TAIL]
    assert "agent stderr during this step" in tail[0]
    assert all("fake-model-agent DEBUG session/" in line for line in tail[1:])
    # Only failing rows get a tail: far less than the 30 lines per request the agent wrote.
    assert report.stderr.count("fake-model-agent DEBUG") == 4 * STDERR_TAIL
    agent_log_path(report.stderr).unlink()


async def test_verify_verbose_shows_the_tail_under_every_row(tmp_path: Path) -> None:
    args = verify_args(tmp_path, "--noise", "1")
    report = await run_verify("--verbose", *args, env=private_tmp(tmp_path), timeout=60)
    report.assert_passed()
    assert report.stderr.count("agent stderr during this step") == 13
    agent_log_path(report.stderr).unlink()


def test_codex_limits_say_what_the_model_then_receives() -> None:
    from acp_bridge.adapters.codex import reopen_effect

    from acp_bridge.commands.verify import Expect, limited_expectation
    from acp_bridge.core.system_prompt import SystemPrompt

    a, b = SystemPrompt.of_text("append", "MARK-A"), SystemPrompt.of_text("append", "MARK-B")
    o = SystemPrompt.of_text("override", "MARK-O")
    markers = ["MARK-A", "MARK-B", "MARK-O"]
    # append A, reloaded with append B: A stays, B is not added, codex's own prompt stays.
    changed = Expect(present=("MARK-B",), absent=("MARK-A",), default="kept")
    assert limited_expectation(changed, reopen_effect(a, b), b, markers, a) == Expect(
        ("MARK-A",), ("MARK-B",), "kept"
    )
    # override O, reopened without a prompt: O stays the base instructions.
    default = Expect(absent=("MARK-O",), default="kept")
    assert limited_expectation(default, reopen_effect(o, None), None, markers, o) == Expect(
        ("MARK-O",), (), "gone"
    )
    # created with override O, later reloaded with override P (which applied), then
    # reopened without a prompt: codex brings back O, the one it stored at creation.
    p = SystemPrompt.of_text("override", "MARK-P")
    default = Expect(absent=("MARK-P", "MARK-O"), default="kept")
    assert limited_expectation(
        default, reopen_effect(p, None), None, [*markers, "MARK-P"], o
    ) == Expect(("MARK-O",), ("MARK-P",), "gone")
    # append A, reopened with override O: O applies and A stays in the history.
    switched = Expect(present=("MARK-O",), absent=("MARK-A",), default="gone")
    assert limited_expectation(switched, reopen_effect(a, o), o, markers, a) == Expect(
        ("MARK-O", "MARK-A"), (), "gone"
    )
    # A limit is still the sentence it always was, for logs and older callers.
    assert all(isinstance(limit, str) for limit in reopen_effect(a, b))


def test_verify_of_a_preset_command_line_needs_no_endpoint_options(
    tmp_path: Path, verify_here: Callable[..., VerifyReport]
) -> None:
    # `acp-bridge verify -- npx -y <package>` of a shipped preset: the preset with the same
    # command says how to point the agent at the endpoint; the adapter is chosen as usual.
    argv = [*FAKE_PYTHON, str(FAKE_MODEL_AGENT), "--sessions", str(tmp_path / "s.json")]
    (tmp_path / "config.yaml").write_text(
        "agents:\n"
        "  fake:\n"
        f"    command: {json.dumps(argv[0])}\n"
        f"    args: {json.dumps(argv[1:])}\n"
        "    adapter: first-turn\n"
        "    verify:\n"
        "      endpoint: openai-chat\n"
        "      env: {OPENAI_BASE_URL: '${ENDPOINT_URL}'}\n"
    )
    report = verify_here("--config", str(tmp_path / "config.yaml"), "--", *argv)
    report.assert_passed()
    assert "as preset 'fake' does" in report.stderr
    assert "adapter native;" in report.stderr  # chosen automatically, not the preset's


def test_the_table_fits_100_columns_and_names_markers_by_role() -> None:
    long_marker = "ACPBRIDGE-OVERRIDE-CHANGED-96815f25"
    rows = [
        Row("baseline (no prompt)", "-", "default prompt recorded", "5938 ch", "PASS"),
        Row(
            "load of a live session, changed prompt",
            "override",
            "marker present, previous absent, default gone",
            "has marker; no previous; default 7%; 213 ch",
            "PASS",
        ),
        Row(
            "load after restart, omitted (default)",
            "override",
            "documented limit: this agent keeps a session's first prompt from session/new; "
            "so first present, changed absent, default gone",
            f"error: the agent answered -32603 about {long_marker} and more words than fit",
            "LIMIT",
        ),
    ]
    table = format_table(rows)
    assert max(len(line) for line in table.splitlines()) <= 100, table
    # Broken after a comma or semicolon, not inside "default gone" or "213 ch".
    assert "default gone" in table and "213 ch" in table, table
    limit_row = rows_of(table, "load after restart, omitted (default)")[0]
    assert status_of(limit_row) == "LIMIT"
    assert "keeps a session's first prompt from session/new" in text_of(limit_row)
    assert long_marker in limit_row


async def test_a_verify_killed_mid_run_leaves_no_home_behind(tmp_path: Path) -> None:
    """The home verify makes holds the agent's configuration and the marker prompts. A run
    stopped by a signal it can handle removes it on its way out; one SIGKILLed leaves that
    to a watchdog, as a bridge's private folders. (Its agent's stderr file is kept, as a
    run ended by Ctrl-C keeps it: its path was printed at the start.)"""
    started = tmp_path / "agent-started"
    hang = f"open({str(started)!r}, 'w').close()\nimport time\ntime.sleep(600)"
    args = ["verify", "--endpoint", "openai-chat", "--", *FAKE_PYTHON, "-c", hang]
    with (tmp_path / "stderr").open("wb") as stderr:
        process = await preloaded.start_bridge(args, env=private_tmp(tmp_path), stderr=stderr)

    def homes() -> list[Path]:
        return [path for path in tmp_path.glob("acp-bridge-verify-*") if path.is_dir()]

    try:
        with trio.fail_after(10):
            while not started.exists():
                await trio.sleep(0.02)
        assert len(homes()) == 1
    finally:
        process.kill()
        await process.wait()
    with trio.move_on_after(NO_HOME_AFTER):
        while homes():
            await trio.sleep(0.05)
    assert homes() == []


# A killed verify's home must be gone by then (as a killed bridge's processes).
NO_HOME_AFTER = 2.0
