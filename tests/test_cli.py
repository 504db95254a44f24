"""The command line around the relay: check, --trace, presets and usage errors."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import preloaded
import pytest
from click.testing import CliRunner
from memory_agent import FAKE_PYTHON

from acp_bridge.commands.cli import main
from acp_bridge.runtime.trace import redact

FAKE_AGENT = str(Path(__file__).with_name("fake_agent.py"))
OVERRIDE_CAPS = json.dumps({"sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}}})


def run_bridge(
    args: list[str], stdin: bytes, env: dict[str, str] | None = None, timeout: float = 30
) -> preloaded.Ran:
    """``python -m acp_bridge ARGS`` with ``stdin``, run to its end; forked from a process
    that has imported the bridge (``preloaded``): what comes after the interpreter's start
    is the same."""
    return preloaded.run_to_end(args, stdin=stdin, env=env, timeout=timeout)


@dataclass(frozen=True)
class Done:
    """What a command line run printed, and its exit status."""

    returncode: int
    stdout: bytes
    stderr: bytes


def run_in_process(args: list[str], env: dict[str, str | None] | None = None) -> Done:
    """The command line in this process (click's runner), as ``python -m acp_bridge``
    names itself; for usage errors, help and configuration errors, which come before
    anything is started (launch.py starts an agent early only for neutral options)."""
    result = CliRunner().invoke(main, args, prog_name="acp-bridge", env=env)
    return Done(result.exit_code, result.stdout_bytes, result.stderr_bytes)


def check_lines(*args: str) -> dict[str, str]:
    """``acp-bridge check ARGS``, the command run in this process (nothing is started
    before it: the agent is started by the command itself, as a process): its report,
    label -> text. The agent's stderr is tested through the real command line."""
    done = run_in_process(["check", *args])
    assert done.returncode == 0, done.stderr
    lines: dict[str, str] = {}
    for line in done.stdout.decode().splitlines():
        label, _, text = line.partition(":")
        lines[label] = text.strip()
    return lines


def test_check_says_in_words_what_the_agent_and_the_bridge_offer() -> None:
    report = check_lines("--", *FAKE_PYTHON, FAKE_AGENT, "--caps", OVERRIDE_CAPS)
    assert report["agent"] == "fake-agent 1.0.0"
    assert report["natively"] == "append and override (the agent advertises systemPrompt)"
    assert report["adapter"] == (
        "native, because the agent advertises systemPrompt and no other adapter recognises it"
    )
    assert report["delivery"] == "agent supports systemPrompt itself: pass it through"
    assert report["advertised"] == "append and override"
    assert not any("{" in text for text in report.values()), report


def test_check_without_a_native_capability_names_the_fallback_and_why() -> None:
    report = check_lines("--", *FAKE_PYTHON, FAKE_AGENT)
    assert report["natively"] == "nothing (the agent does not advertise systemPrompt)"
    assert report["adapter"] == (
        "first-turn, because no adapter recognises the agent and it does not advertise systemPrompt"
    )
    assert report["advertised"] == "append only"


def test_check_says_an_adapter_was_given_and_the_policy_narrowed_the_offer() -> None:
    agent = ["--", *FAKE_PYTHON, FAKE_AGENT, "--caps", OVERRIDE_CAPS]
    report = check_lines("--adapter", "native", "--no-override", *agent)
    assert report["adapter"] == "native, given with --adapter"
    assert report["advertised"] == "append only"
    report = check_lines("--adapter", "passthrough", *agent)
    assert (
        report["advertised"] == "append and override (the agent's own answer, relayed as it came)"
    )
    report = check_lines("--adapter", "passthrough", "--", *FAKE_PYTHON, FAKE_AGENT)
    assert report["advertised"] == "nothing (the agent's own answer, relayed as it came)"


def test_check_labels_the_agents_own_stderr() -> None:
    script = f"echo 'starting up, says the agent' >&2; exec {' '.join(FAKE_PYTHON)} {FAKE_AGENT}"
    done = run_bridge(["check", "--", "sh", "-c", script], b"")
    assert done.returncode == 0, done.stderr
    assert b"agent stderr: starting up, says the agent\n" in done.stderr
    assert b"starting up" not in done.stdout


def test_check_with_no_override_policy_advertises_append_only() -> None:
    args = [
        "check",
        "--no-override",
        "--json",
        "--",
        sys.executable,
        FAKE_AGENT,
        "--caps",
        OVERRIDE_CAPS,
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["native"] == {"mode": {"override": {}}}
    assert report["advertised"] == {}


def test_check_names_a_command_that_cannot_start() -> None:
    result = CliRunner().invoke(main, ["check", "--", "/nonexistent/agent"])
    assert result.exit_code == 1
    assert "The agent command '/nonexistent/agent' could not be started" in result.output


def test_unknown_adapter_and_missing_agent_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["--adapter", "nope", "--", *FAKE_PYTHON, FAKE_AGENT])
    assert result.exit_code == 1 and "unknown adapter 'nope'" in result.output
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 2 and "no agent" in result.output
    result = CliRunner().invoke(main, ["--agent", "no-such-preset"])
    assert result.exit_code == 1 and "no-such-preset" in result.output


def test_agent_command_without_double_dash_runs_too(tmp_path: Path) -> None:
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    done = run_bridge(["--state", ":memory:", *FAKE_PYTHON, FAKE_AGENT], init)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["agentInfo"]["name"] == "fake-agent"


def test_trace_records_every_frame_with_prompt_text_redacted(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    secret = "TOP-SECRET-PERSONA"
    frames = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {
                "cwd": "/",
                "mcpServers": [],
                "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": secret}]},
            },
        },
    ]
    stdin = b"".join(json.dumps(f).encode() + b"\n" for f in frames)
    done = run_bridge(
        ["--state", ":memory:", "--trace", str(trace), "--", *FAKE_PYTHON, FAKE_AGENT], stdin
    )
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in trace.read_text().splitlines()]
    directions = {e["dir"] for e in entries}
    assert {"client->bridge", "bridge->agent", "agent->bridge", "agent->client"} <= directions
    assert secret not in trace.read_text()
    assert all(isinstance(e["ts"], float) for e in entries)


def test_redact_keeps_everything_but_prompt_text() -> None:
    message: dict[str, Any] = {
        "method": "session/load",
        "params": {
            "sessionId": "s",
            "systemPrompt": {"mode": "override", "content": [{"type": "text", "text": "abc"}]},
            "_meta": {"systemPrompt": {"append": "xyz"}, "other": 1},
        },
    }
    redacted = redact(message)
    assert redacted["params"]["sessionId"] == "s"
    assert redacted["params"]["systemPrompt"]["content"][0]["text"] == "<redacted> 3 chars"
    assert redacted["params"]["_meta"] == {"systemPrompt": {"append": "<redacted>"}, "other": 1}
    assert message["params"]["systemPrompt"]["content"][0]["text"] == "abc"


def test_top_level_help_shows_the_run_options() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    for option in (
        "--agent",
        "--config",
        "--adapter",
        "--state",
        "--no-override",
        "--on-omitted",
        "--log-level",
        "--trace",
        "--trace-prompts",
        "--version",
    ):
        assert option in result.output, option
    assert "AGENT_CMD" in result.output
    for command in ("check", "verify", "sessions", "serve"):
        assert command in result.output


def test_sessions_alone_lists_the_sessions(tmp_path: Path) -> None:
    from acp_bridge.core.system_prompt import SystemPrompt
    from acp_bridge.state.store import SessionStore

    state = tmp_path / "sessions.sqlite3"
    with SessionStore(str(state)) as store:
        store.save("fake-agent", "sess-listed", SystemPrompt.of_text("append", "SECRET"))
    result = CliRunner().invoke(main, ["sessions", "--state", str(state)])
    assert result.exit_code == 0, result.output
    assert "sess-listed" in result.output
    assert "SECRET" not in result.output
    assert (
        result.output
        == CliRunner().invoke(main, ["sessions", "--state", str(state), "list"]).output
    )


def test_every_shipped_preset_says_how_to_install_its_agent() -> None:
    from acp_bridge.settings import load_config

    config = load_config(None)
    assert {"claude", "claude-legacy", "goose", "codex"} <= set(config.agents)
    for name, preset in config.agents.items():
        assert preset.install.strip(), f"preset {name} has no install hint"
    assert "GOOSE_BINARY" in config.agents["goose"].install


def missing_agent_env(tmp_path: Path) -> dict[str, str]:
    """An environment where no preset's agent can be found: PATH has only python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }


@pytest.mark.parametrize("command", [[], ["check"], ["verify"]], ids=["run", "check", "verify"])
def test_a_preset_whose_agent_is_missing_says_how_to_install_it(
    tmp_path: Path, command: list[str]
) -> None:
    done = run_bridge(
        [*command, "--agent", "goose"], b"", env=missing_agent_env(tmp_path), timeout=60
    )
    assert done.returncode != 0
    error = done.stderr.decode()
    assert "The agent command 'goose' could not be started" in error
    assert "GOOSE_BINARY" in error and "npm install" in error
    assert "Traceback" not in error


def test_a_missing_npx_for_the_claude_preset_says_node_is_needed(tmp_path: Path) -> None:
    done = run_bridge(
        ["check", "--agent", "claude"], b"", env=missing_agent_env(tmp_path), timeout=60
    )
    assert done.returncode == 1
    error = done.stderr.decode()
    assert "The agent command 'npx' could not be started" in error and "Node.js" in error


def test_the_editor_sees_the_install_hint_in_the_initialize_error(tmp_path: Path) -> None:
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    done = run_bridge(["--agent", "goose"], init, env=missing_agent_env(tmp_path), timeout=60)
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["id"] == 1
    assert "GOOSE_BINARY" in json.dumps(answer["error"])


@pytest.mark.parametrize(
    "args",
    [
        ["--agnet", "claude"],
        ["--state", ":memory:", "--agnet", "claude"],
        ["check", "--agnet", "claude"],
        ["verify", "--agnet", "claude"],
        ["serve", "--listen", "unix:sock", "--agnet", "claude"],
    ],
)
def test_a_mistyped_option_is_a_usage_error_not_the_agent(args: list[str]) -> None:
    done = run_in_process(args)
    assert done.returncode == 2, done.stderr
    # click's own words (8.5: "No such option '--agnet'. Did you mean '--agent'?").
    error = done.stderr.decode().splitlines()[-1]
    assert error.startswith("Error: No such option") and "--agnet" in error, error
    assert "Did you mean" in error and "--agent" in error, error
    assert b"could not be started" not in done.stderr and done.stdout == b""


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["chek", "--agent", "claude"], b"'check'"),
        (["verfy", "--agent", "claude"], b"'verify'"),
        (["sesions"], b"'sessions'"),
        (["serv", "--listen", "unix:sock"], b"'serve'"),
    ],
)
def test_a_mistyped_command_is_a_usage_error_suggesting_it(
    args: list[str], suggestion: bytes
) -> None:
    done = run_in_process(args)
    assert done.returncode == 2, done.stderr
    assert f"No such command '{args[0]}'.".encode() in done.stderr
    assert b"Did you mean " + suggestion in done.stderr
    assert b"could not be started" not in done.stderr and done.stdout == b""


def test_an_installed_agent_named_like_a_command_still_runs(tmp_path: Path) -> None:
    """Close to ``serve``, but an executable on PATH and no --agent: the agent command."""
    script = tmp_path / "serv"
    script.write_text(f"#!/bin/sh\nexec {' '.join(FAKE_PYTHON)} {FAKE_AGENT}\n")
    script.chmod(0o755)
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    done = run_bridge(["--state", ":memory:", "serv"], init, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["agentInfo"]["name"] == "fake-agent"


def test_after_double_dash_a_word_like_a_command_is_the_agent_command() -> None:
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    done = run_bridge(["--state", ":memory:", "--", "chek", "--agent", "claude"], init)
    assert done.returncode != 2, done.stderr
    assert b"The agent command 'chek' could not be started" in done.stderr


def test_a_bare_command_shows_the_usage_the_user_typed() -> None:
    done = run_in_process([])
    assert done.returncode == 2
    usage = done.stderr.decode()
    assert "acp-bridge run" not in usage, usage
    assert "Usage: acp-bridge [OPTIONS] [--] AGENT_CMD..." in usage
    assert "Try 'acp-bridge --help' for help." in usage
    assert "no agent: give --agent NAME or an agent command after --" in usage


@pytest.mark.parametrize("columns", ["80", "60"])
def test_help_gives_each_command_summary_whole(columns: str) -> None:
    done = run_in_process(["--help"], env={"COLUMNS": columns})
    assert done.returncode == 0, done.stderr
    commands = done.stdout.decode().partition("\nCommands:\n")[2]
    summaries = " ".join(commands.split())
    assert "..." not in summaries, commands
    assert "Initialize the agent once and show what it and the bridge advertise." in summaries
    assert "Sidecar: accept ACP connections on a socket, one agent process per connection." in (
        summaries
    )


def test_a_misspelt_config_key_gets_a_suggestion(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("bridge:\n  allow_overide: false\nagents:\n  claude:\n    envv: {}\n")
    done = run_bridge(["--config", str(config), "--", *FAKE_PYTHON, FAKE_AGENT], b"")
    assert done.returncode == 1
    error = done.stderr.decode()
    assert f"{config}: bridge.allow_overide: unknown key (did you mean allow_override?)" in error
    assert f"{config}: agents.claude.envv: unknown key (did you mean env?)" in error


def test_an_undefined_variable_names_the_file_that_uses_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("agents:\n  mine:\n    command: ${MY_AGENT_BIN_UNSET}\n")
    done = run_in_process(
        ["--config", str(config), "--agent", "mine"], env={"MY_AGENT_BIN_UNSET": None}
    )
    assert done.returncode == 1
    assert (
        f"Error: {config}: agents.mine.command: ${{MY_AGENT_BIN_UNSET}} is not defined"
        in done.stderr.decode()
    )
