"""``--trace``: a private file, and no copy of the system prompt text in it (spec §8).

Each adapter names its own wire forms (``Adapter.redact``); the tracer adds the client's
forms and, as a net, any string equal to a prompt text the client sent in this run.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, cast

import preloaded
import pytest
import trio
from conftest import FAKE_AGENT, OpenBridge, OpenMemoryBridge
from memory_agent import FAKE_PYTHON

from acp_bridge.adapter import AdapterContext
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.runtime.trace import TraceFileError, Tracer, redact, redact_at
from acp_bridge.wire.jsonrpc import JsonObject
from adapters.claude import SUCCESSOR_NAME, ClaudeAdapter, ClaudeAgent, system_prompt_meta
from adapters.first_turn import FirstTurnAdapter
from adapters.goose import SET_METHOD, GooseAdapter

SECRET = "TOP-SECRET-PERSONA"


class Context:
    log = logging.getLogger("test")


def context() -> AdapterContext:
    return cast(AdapterContext, Context())


def traced(path: Path) -> list[JsonObject]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def run_bridge(
    open_bridge: OpenBridge, trace: Path, frames: list[JsonObject], *agent_args: str
) -> None:
    """Send each frame once the previous one was answered (as a client would)."""
    with trio.fail_after(30):
        async with open_bridge(*agent_args, bridge_args=["--trace", str(trace)]) as bridge:
            for frame in frames:
                await bridge.send(frame)
                answer = await bridge.response_to(frame["id"])
                assert "result" in answer, answer
            await bridge.close_stdin()
            await bridge.read_to_eof()
            assert await bridge.wait() == 0


def request(request_id: int, method: str, params: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


INITIALIZE = request(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})


def new_session(prompt: JsonObject) -> JsonObject:
    return request(2, "session/new", {"cwd": "/", "mcpServers": [], "systemPrompt": prompt})


def test_trace_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    old = os.umask(0o022)
    try:
        Tracer(path).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_loose_trace_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    path.chmod(0o644)
    Tracer(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_trace_path_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(
    tmp_path: Path,
) -> None:
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n")
    target.chmod(0o644)
    link = tmp_path / "trace.jsonl"
    link.symlink_to(target)
    with pytest.raises(TraceFileError, match="symbolic link"):
        Tracer(link)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "theirs\n"
    # A dangling link does not create its target either.
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "not-yet")
    with pytest.raises(TraceFileError, match="symbolic link"):
        Tracer(dangling)
    assert not (tmp_path / "not-yet").exists()


def test_a_trace_path_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo, 0o644)
    with pytest.raises(TraceFileError):
        Tracer(fifo)  # neither blocks waiting for a reader nor changes its mode
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644


def test_the_command_names_a_trace_file_it_cannot_open(tmp_path: Path) -> None:
    link = tmp_path / "trace.jsonl"
    link.symlink_to(tmp_path / "elsewhere")
    argv = ["--state", ":memory:", "--trace", str(link), "--", *FAKE_PYTHON, str(FAKE_AGENT)]
    done = preloaded.run_to_end(argv)  # forked from a process that has imported the bridge
    assert done.returncode != 0
    stderr = done.stderr.decode()
    assert str(link) in stderr and "symbolic link" in stderr
    assert "Traceback" not in stderr


async def test_first_turn_block_sent_to_the_agent_is_redacted(
    open_memory_bridge: OpenMemoryBridge, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    prompt = {"mode": "append", "content": [{"type": "text", "text": SECRET}]}
    turn = {"sessionId": "sess-1", "prompt": [{"type": "text", "text": "hi"}]}
    frames = [INITIALIZE, new_session(prompt), request(3, "session/prompt", turn)]
    await run_bridge(open_memory_bridge, trace, frames)
    # (the fake agent echoes its user turn back as agent text: that copy is the model's)
    assert not [
        e for e in traced(trace) if SECRET in json.dumps(e) and "update" not in json.dumps(e)
    ]
    (forwarded,) = [
        e["frame"]
        for e in traced(trace)
        if e["dir"] == "bridge->agent" and e["frame"].get("method") == "session/prompt"
    ]
    assert [b["text"] for b in forwarded["params"]["prompt"]] == [
        f"<redacted> {len(SECRET)} chars",
        "hi",
    ]
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600


async def test_claude_override_for_versions_that_pin_prompts_is_redacted(
    open_memory_bridge: OpenMemoryBridge, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    prompt = {"mode": "override", "content": [{"type": "text", "text": SECRET}]}
    await run_bridge(
        open_memory_bridge, trace, [INITIALIZE, new_session(prompt)], "--name", SUCCESSOR_NAME
    )
    assert SECRET not in trace.read_text()


# --- each adapter's own forms, when the tracer never saw the client send the text --------
# (a prompt restored from the store after a restart reaches the agent without the client
# sending it again)


def claude_load(prompt: SystemPrompt) -> JsonObject:
    agent = ClaudeAgent(SUCCESSOR_NAME, (0, 91, 0), can_close=True)
    meta = system_prompt_meta(prompt, agent)
    return request(5, "session/load", {"sessionId": "s", "cwd": "/", "_meta": meta})


@pytest.mark.parametrize("mode", ["append", "override"])
def test_claude_adapter_names_its_forms(tmp_path: Path, mode: Any) -> None:
    path = tmp_path / "trace.jsonl"
    adapter = ClaudeAdapter(context())
    tracer = Tracer(path, redactor=adapter.redact)
    tracer.record("bridge->agent", b"", claude_load(SystemPrompt.of_text(mode, SECRET)))
    tracer.close()
    assert SECRET not in path.read_text()
    assert "claudeCode" in path.read_text() or mode == "append"


def test_goose_adapter_names_its_set_method(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracer = Tracer(path, redactor=GooseAdapter(context()).redact)
    params = {"sessionId": "s", "mode": "set", "text": "{% raw %}" + SECRET + "{% endraw %}"}
    tracer.record("bridge->agent", b"", request(9, SET_METHOD, params))
    tracer.close()
    (entry,) = traced(path)
    assert entry["frame"]["params"]["text"].startswith("<redacted>")
    assert entry["frame"]["params"]["mode"] == "set"


async def test_first_turn_adapter_names_the_block_it_prepended(tmp_path: Path) -> None:
    adapter = FirstTurnAdapter(context())

    class Call:
        prompt = SystemPrompt.of_text("append", SECRET)
        session_id = "s"
        delivered = None

        def __init__(self) -> None:
            self.params: JsonObject = {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}

        async def forward(self) -> Any:
            from acp_bridge.adapter import Reply

            return Reply(result={})

        def mark_delivered(self, fingerprint: str | None) -> None:
            pass

    call = Call()
    await adapter.session_prompt(cast(Any, call))
    path = tmp_path / "trace.jsonl"
    tracer = Tracer(path, redactor=adapter.redact)
    tracer.record("bridge->agent", b"", request(3, "session/prompt", call.params))
    # The client's own turn, even with the same words, is not the adapter's block.
    tracer.record("client->bridge", b"", request(3, "session/prompt", call.params))
    tracer.close()
    first, second = traced(path)
    assert first["frame"]["params"]["prompt"][0]["text"].startswith("<redacted>")
    assert second["frame"]["params"]["prompt"][0]["text"] == SECRET


def test_redact_at_copies_and_ignores_missing_paths() -> None:
    message: JsonObject = {"params": {"a": [{"t": "x"}]}}
    changed = redact_at(message, ("params", "a", 0, "t"))
    assert changed == {"params": {"a": [{"t": "<redacted> 1 chars"}]}}
    assert message == {"params": {"a": [{"t": "x"}]}}
    assert redact_at(message, ("params", "b", "c")) is message
    assert redact_at(message, ("params", "a", 3, "t")) is message


def test_redact_hides_the_python_sdks_meta_spelling() -> None:
    prompt = {"mode": "append", "content": [{"type": "text", "text": "TOP-SECRET"}]}
    message: dict[str, Any] = {
        "method": "session/new",
        "params": {"_meta": {"system_prompt": prompt, "k": 1}},
    }
    redacted = redact(message)
    assert "TOP-SECRET" not in json.dumps(redacted)
    assert redacted["params"]["_meta"]["k"] == 1
    assert message["params"]["_meta"]["system_prompt"] == prompt
