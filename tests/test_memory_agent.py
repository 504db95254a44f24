"""The fake agent run as a coroutine answers as the fake agent process does, byte for byte,
and stops as the runtime stops a process (stdin closed, then SIGTERM, then SIGKILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import trio
import trio.testing
from memory_agent import FAKE_AGENT, ScriptedAgent

from acp_bridge.supervision.agent_process import EOF_WAIT


def line(message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"


def request(request_id: object, method: str, params: object = None) -> bytes:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return line(message)


# Every branch of the script, and input a process reads as it comes: a bad line, a blank
# line, a batch, a last line without its newline.
INPUT = b"".join(
    [
        request(0, "initialize", {"protocolVersion": 1}),
        request("v2", "initialize", {"protocolVersion": 2}),
        request(1, "session/new", {"cwd": "/", "mcpServers": []}),
        request(2, "session/fork", {"sessionId": "x-1", "cwd": "/"}),
        request(3, "session/load", {"sessionId": "x-1"}),
        request(
            4, "session/prompt", {"sessionId": "x-1", "prompt": [{"type": "text", "text": "é"}]}
        ),
        request(5, "_test/echo", {"a": [1, 2.5, None]}),
        request(6, "_test/emit", {"lines": ["not json", '{"jsonrpc":"2.0","method":"x"}']}),
        request(7, "_test/hold", {"held": 7}),
        request(8, "_test/hold", {"held": 8}),
        line({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}}),
        request(9, "_test/release"),
        request(10, "_test/ask_client", {"id": "c", "method": "fs/read_text_file"}),
        line({"jsonrpc": "2.0", "id": "c", "result": {"content": "x"}}),
        request(11, "session/delete", {"sessionId": "x-1"}),
        request(12, "no/such"),
        request(13, "session/close", {"sessionId": "x-1"}),
        b"{ not json\n",
        b"\n",
        line([{"jsonrpc": "2.0", "id": "b1", "method": "m"}, {"jsonrpc": "2.0", "method": "n"}]),
        request(14, "_test/echo", {"last": True}).rstrip(b"\n"),
    ]
)
ARGS = ["--name", "twin", "--caps", '{"loadSession":true}', "--session-prefix", "x-"]
ARGS += ["--fail-method", "session/close", "--fail-message", "closed on purpose"]
ARGS += ["--eof-exit-code", "5"]


def test_the_coroutine_answers_as_the_process_does(tmp_path: Path) -> None:
    process_record = tmp_path / "process.jsonl"
    done = subprocess.run(
        [sys.executable, str(FAKE_AGENT), "--record", str(process_record), *ARGS],
        input=INPUT,
        capture_output=True,
        timeout=30,
        check=False,
    )
    memory_record = tmp_path / "memory.jsonl"
    agent = ScriptedAgent(
        [sys.executable, str(FAKE_AGENT), "--record", str(memory_record), *ARGS], {}
    )

    async def drive() -> bytes:
        output = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await agent.stdin.send_all(INPUT)
            await agent.stdin.aclose()
            while data := await agent.stdout.receive_some(1 << 16):
                output += data
        return bytes(output)

    assert trio.run(drive) == done.stdout
    assert agent.returncode == done.returncode == 5
    assert memory_record.read_bytes() == process_record.read_bytes()


async def stopped(*args: str, grace: float) -> tuple[ScriptedAgent, int, float]:
    agent = ScriptedAgent([sys.executable, str(FAKE_AGENT), *args], {})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        start = trio.current_time()
        status = await agent.stop(grace)
        took = trio.current_time() - start
    return agent, status, took


async def test_an_agent_that_exits_on_eof_is_not_signalled(autojump_clock: object) -> None:
    agent, status, took = await stopped("--eof-exit-code", "3", grace=2.0)
    assert (status, agent.terminated_by_bridge, took) == (3, False, 0)


async def test_an_agent_ignoring_eof_is_terminated_after_the_eof_wait(
    autojump_clock: object,
) -> None:
    agent, status, took = await stopped("--ignore-eof", grace=2.0)
    assert (status, agent.terminated_by_bridge, took) == (-signal.SIGTERM, True, EOF_WAIT)


async def test_an_agent_ignoring_sigterm_is_killed_after_the_grace(autojump_clock: object) -> None:
    agent, status, took = await stopped("--ignore-eof", "--ignore-term", grace=2.0)
    assert (status, agent.terminated_by_bridge) == (-signal.SIGKILL, True)
    assert took == EOF_WAIT + 2.0


async def test_an_agent_whose_stdout_reader_left_dies_of_the_broken_pipe() -> None:
    agent = ScriptedAgent([sys.executable, str(FAKE_AGENT)], {})
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await agent.stdout.aclose()
            await agent.stdin.send_all(request(1, "_test/echo", {}))
            assert await agent.wait() == 1
