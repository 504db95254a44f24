"""An ACP agent that runs as a coroutine over in-memory streams: no process, no sleeps.

:func:`memory_spawner` plugs it into :class:`~acp_bridge.runtime.relay.Bridge` through the
injectable spawner, so runtime tests run under trio's ``MockClock``. It answers like
``tests/fake_agent.py`` (the subprocess double the CLI tests use) for what those tests
need, and logs every message it receives in :attr:`MemoryAgent.received`.

Steering methods: ``_test/echo`` (result: params), ``_test/hold`` (answered when
``_test/release`` arrives), ``_test/ask_client`` (sends the client ``params.method`` as a
request and answers with the client's result). ``session/new`` answers ``sess-N``;
``session/close`` and ``session/delete`` answer ``{}`` (or ``close_error``);
``session/prompt`` answers ``{"stopReason": "end_turn"}`` at once or ``cancelled`` after
``session/cancel``. ``protocol_version=2`` answers ``initialize`` in version 2's shape
(``info``, ``capabilities.session``). ``initialize_gate``: an event ``initialize`` is
answered only once set; :meth:`MemoryAgent.exit` ends it as a crash would.
``piped_output=True``: what it writes goes through a real pipe, which the bridge reads as it
reads an agent process's stdout (the agent's input stays in memory).

:class:`ScriptedAgent` is ``tests/fake_agent.py`` or ``tests/fake_goose.py`` itself (its
``Script``) as a coroutine, started from that file's command line by
:class:`ScriptedSpawner`: tests written against the subprocess run unchanged without one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import fake_agent
import fake_goose
import trio
import trio.testing

from acp_bridge.runtime.relay import AgentHandle
from acp_bridge.supervision.agent_process import EOF_WAIT
from acp_bridge.wire import jsonrpc

FAKE_AGENT: Final = Path(fake_agent.__file__).resolve()
FAKE_GOOSE: Final = Path(fake_goose.__file__).resolve()
# How the tests start the fake agents of tests/ as processes. They use the standard
# library only, so they start without the site module: no site-packages to scan and no
# import hook of an editable install (a bare interpreter's start took 11 ms of CPU so
# instead of 30 ms here).
FAKE_PYTHON: Final = (sys.executable, "-S")


def read_json(line: bytes) -> Any:
    """A line as a JavaScript agent reads it: integers of any length, nesting a few
    thousand levels deep (Python's json alone stops at 4,300 digits and about 1,000)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, DEEPEST_READ))
    try:
        return json.loads(line, parse_int=jsonrpc._parse_int)
    finally:
        sys.setrecursionlimit(limit)


def write_json(message: Any) -> bytes:
    """A message as that agent writes it back: as deep as it could read it (the bridge's
    own encoder allows only a few times the usual depth)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, DEEPEST_READ))
    try:
        return jsonrpc.encode(message)
    finally:
        sys.setrecursionlimit(limit)


DEEPEST_READ = 20_000


class InMemoryProcess:
    """What both in-memory agents share with a process (the runtime's ``AgentHandle``): a
    made-up pid, stdin and stdout as in-memory streams, and an exit status once ended."""

    def __init__(self, argv: Sequence[str], pid: int, *, piped_output: bool = False) -> None:
        self.pid = pid
        self.argv = list(argv)
        self.stdin, self._input = trio.testing.memory_stream_one_way_pair()
        self._output: trio.abc.SendStream
        self.stdout: trio.abc.ReceiveStream
        if piped_output:
            # A real pipe, as a process's stdout is: the bridge reads it as it reads an
            # agent process's (``pipes.read_now`` first, a wait only when it is empty).
            read_end, write_end = os.pipe()
            self._output = trio.lowlevel.FdStream(write_end)
            self.stdout = trio.lowlevel.FdStream(read_end)
        else:
            self._output, self.stdout = trio.testing.memory_stream_one_way_pair()
        self.received_raw: list[bytes] = []
        self.terminated_by_bridge = False
        self.returncode: int | None = None
        self._exited = trio.Event()
        self._cancel_scope = trio.CancelScope()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class MemoryAgent(InMemoryProcess):
    """One in-memory agent process (implements the runtime's ``AgentHandle``)."""

    _pids = 10_000

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        session_capabilities: Mapping[str, Any] | None = None,
        name: str = "memory-agent",
        commands_after_new: bool = False,
        updates_after_new: int = 0,
        update_padding: int = 0,
        protocol_version: int = 1,
        close_error: Mapping[str, Any] | None = None,
        initialize_gate: trio.Event | None = None,
        session_new_answer: bytes | None = None,
        piped_output: bool = False,
    ) -> None:
        MemoryAgent._pids += 1
        super().__init__(argv, MemoryAgent._pids, piped_output=piped_output)
        self.env = dict(env)
        self.name = name
        if session_capabilities is None:
            session_capabilities = {"close": {}}
        self.session_capabilities = dict(session_capabilities)
        self.received: list[Any] = []
        self.commands_after_new = commands_after_new
        # How many session/update notifications about a new session follow its answer, each
        # padded with so many bytes (an agent that streams on about a session at once).
        self.updates_after_new = updates_after_new
        self.update_padding = update_padding
        self.protocol_version = protocol_version
        # The line to answer session/new with instead of a session, ``{id}`` standing for
        # the request's id as JSON (an agent that answers wrongly).
        self.session_new_answer = session_new_answer
        self.close_error = dict(close_error) if close_error is not None else None
        self.unparsed: list[bytes] = []
        self.bytes_received = 0
        self._writing = trio.Lock()
        self._held: list[Any] = []
        self._asked: dict[Any, Any] = {}
        self._sessions = 0
        self.prompt_gate: trio.Event | None = None
        self.initialize_gate = initialize_gate

    async def run(self) -> None:
        try:
            await self._serve()
        finally:
            self.returncode = 0 if self.returncode is None else self.returncode
            self._exited.set()

    async def _serve(self) -> None:
        with self._cancel_scope:
            buffer = b""
            while True:
                data = await self._input.receive_some(1 << 16)
                if not data:
                    break
                self.bytes_received += len(data)
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self.received_raw.append(line)
                    try:
                        message = read_json(line)
                    except (ValueError, RecursionError):
                        # As the ACP SDKs do: a line that does not parse is logged and dropped.
                        self.unparsed.append(line)
                        continue
                    self.received.append(message)
                    await self._handle(message)
        with trio.CancelScope(shield=True):
            await self._output.aclose()

    async def send(self, message: Any) -> None:
        await self.send_raw(write_json(message))

    async def send_bytes(self, data: bytes) -> None:
        """Write bytes as they are: part of a line, or several."""
        async with self._writing:
            await self._output.send_all(data)

    async def send_raw(self, line: bytes) -> None:
        async with self._writing:
            await self._output.send_all(line + b"\n")

    async def _answer(self, request_id: Any, result: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _handle(self, message: Any) -> None:
        if isinstance(message, list):
            for member in message:
                await self._handle(member)
            return
        if not isinstance(message, dict):
            return
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        request_id = message.get("id")
        if method is None:
            waiting = self._asked.pop(request_id, None)
            if waiting is not None:
                await self._answer(waiting, message.get("result"))
            return
        if method == "initialize" and self.initialize_gate is not None:
            await self.initialize_gate.wait()
        if method == "initialize" and self.protocol_version == 2:
            await self._answer(
                request_id,
                {
                    "protocolVersion": 2,
                    "info": {"name": self.name, "version": "1.0"},
                    "capabilities": {"session": self.session_capabilities},
                },
            )
        elif method == "initialize":
            await self._answer(
                request_id,
                {
                    "protocolVersion": 1,
                    "agentInfo": {"name": self.name, "version": "1.0"},
                    "agentCapabilities": {
                        "loadSession": True,
                        "sessionCapabilities": self.session_capabilities,
                    },
                },
            )
        elif method == "session/new" and self.session_new_answer is not None:
            line = self.session_new_answer.replace(b"{id}", jsonrpc.encode(request_id))
            await self.send_raw(line)
        elif method == "session/new":
            await self._new_session(request_id)
        elif method == "session/close" and self.close_error is not None:
            await self.send({"jsonrpc": "2.0", "id": request_id, "error": self.close_error})
        elif method in ("session/load", "session/resume", "session/close", "session/delete"):
            await self._answer(request_id, {})
        elif method == "session/prompt":
            if self.prompt_gate is not None:
                await self.prompt_gate.wait()
            await self._answer(request_id, {"stopReason": "end_turn"})
        elif method == "_test/echo":
            await self._answer(request_id, params)
        elif method == "_test/hold":
            self._held.append(message)
        elif method == "_test/release":
            for held in self._held:
                await self._answer(held["id"], held.get("params"))
            self._held.clear()
            await self._answer(request_id, {})
        elif method == "_test/ask_client":
            self._asked[params["id"]] = request_id
            await self.send(
                {"jsonrpc": "2.0", "id": params["id"], "method": params["method"], "params": {}}
            )
        elif request_id is not None:
            await self.send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": f"no method {method}"},
                }
            )

    async def _new_session(self, request_id: Any) -> None:
        self._sessions += 1
        session_id = f"sess-{self._sessions}"
        await self._answer(request_id, {"sessionId": session_id})
        if self.commands_after_new:
            # As claude-agent-acp does: the session's commands right after its answer.
            commands = {"sessionUpdate": "available_commands_update", "availableCommands": []}
            await self._update(session_id, commands)
        pad = "x" * self.update_padding
        for number in range(self.updates_after_new):
            chunk = {"sessionUpdate": "agent_message_chunk", "n": number, "pad": pad}
            await self._update(session_id, chunk)

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        await self.send(
            {"jsonrpc": "2.0", "method": "session/update",
             "params": {"sessionId": session_id, "update": update}}
        )  # fmt: skip

    def exit(self, status: int) -> None:
        """End now, as a crash would: nothing more is read or answered."""
        self.returncode = status
        self._cancel_scope.cancel()

    async def stop(self, grace: float) -> int:
        with trio.CancelScope(shield=True):
            await self.stdin.aclose()
            with trio.move_on_after(grace):
                await self.wait()
            if not self._exited.is_set():
                self.terminated_by_bridge = True
                self.returncode = -15
                self._cancel_scope.cancel()
            status = await self.wait()
        return status


class MemorySpawner:
    """Starts :class:`MemoryAgent` coroutines in a nursery; keeps every one it started."""

    def __init__(self, nursery: trio.Nursery, **agent_options: Any) -> None:
        self.nursery = nursery
        self.agent_options = agent_options
        self.agents: list[MemoryAgent] = []

    async def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
    ) -> AgentHandle:
        agent = MemoryAgent(argv, env, **self.agent_options)
        self.agents.append(agent)
        self.nursery.start_soon(agent.run)
        return agent


class ScriptedAgent(InMemoryProcess):
    """``tests/fake_agent.py`` or ``tests/fake_goose.py`` run as a coroutine: the same
    ``Script`` answers, read from the same command line, over in-memory streams (implements
    ``AgentHandle``).

    What the process would write to files it writes too (``--record``, ``--sent``;
    ``--pidfile`` gets the made-up pid). Stopping goes as :class:`AgentProcess` stops a
    process: stdin closed, then after ``EOF_WAIT`` a SIGTERM (ignored under
    ``--ignore-term``), then after ``grace`` a SIGKILL. A grandchild needs a process: those
    options are refused.
    """

    _pids = 20_000

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        command = list(argv[1:])
        if command[:1] == ["-S"]:  # conftest.FAKE_PYTHON
            command = command[1:]
        program = Path(command[0]).resolve() if command else None
        self.script: fake_agent.Script | fake_goose.Script
        if program == FAKE_AGENT:
            self.args = fake_agent.parse_args(command[1:])
            if self.args.grandchild_pidfile:
                raise ValueError("a grandchild needs a real process")
            self.script = fake_agent.Script.of(self.args)
        elif program == FAKE_GOOSE:
            # The process would see the bridge's environment with the agent's on top.
            self.script = fake_goose.Script(command[1:], {**os.environ, **env})
            self.args = fake_agent.parse_args([])  # a process's defaults
        else:
            raise ValueError(f"not a command of a fake agent in tests/: {list(argv)}")
        ScriptedAgent._pids += 1
        super().__init__(argv, ScriptedAgent._pids)
        self.sent_raw: list[bytes] = []
        self.failure: Exception | None = None
        if self.args.pidfile:
            Path(self.args.pidfile).write_text(str(self.pid))

    async def run(self) -> None:
        try:
            with self._cancel_scope:
                try:
                    await self._serve()
                    self.returncode = self.args.eof_exit_code
                except trio.BrokenResourceError:
                    # Its stdout's reader is gone: Python dies of BrokenPipeError, status 1.
                    self.returncode = 1
                except Exception as exc:
                    # The script failed (a line it cannot read, say): so would the process,
                    # with its traceback and status 1.
                    self.failure = exc
                    self.returncode = 1
        finally:
            with trio.CancelScope(shield=True):
                await self._output.aclose()
                await self._input.aclose()
            if self.returncode is None:
                self.returncode = -9
            self._exited.set()

    async def _serve(self) -> None:
        buffer = b""
        while True:
            data = await self._input.receive_some(1 << 16)
            if not data:
                break
            buffer += data
            while (end := buffer.find(b"\n")) >= 0:
                raw, buffer = buffer[: end + 1], buffer[end + 1 :]
                await self._on_line(raw)
        if buffer:
            await self._on_line(buffer)  # the last line, without its newline
        if self.args.ignore_eof:
            await trio.sleep_forever()

    async def _on_line(self, raw: bytes) -> None:
        self.received_raw.append(raw)
        if self.args.record:
            with open(self.args.record, "ab") as record:
                record.write(raw if raw.endswith(b"\n") else raw + b"\n")
        try:
            output: fake_agent.Output = list(self.script.on_line(raw))
        except SystemExit as exit:  # fake_goose's --exit-on-set
            output = [fake_agent.Exit(int(exit.code or 0))]
        for item in output:
            if isinstance(item, fake_agent.Exit):
                self.exit(item.code)
                await trio.lowlevel.checkpoint()
                return
            self.sent_raw.append(item)
            if self.args.sent:
                with open(self.args.sent, "ab") as sent:
                    sent.write(item + b"\n")
            await self._output.send_all(item + b"\n")

    def exit(self, status: int) -> None:
        """End now: nothing more is read or answered, stdout is closed."""
        if self.returncode is None:
            self.returncode = status
        self._cancel_scope.cancel()

    async def _exited_within(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self._exited.wait()
        return self._exited.is_set()

    async def stop(self, grace: float) -> int:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stdin.aclose()
            if not await self._exited_within(min(EOF_WAIT, grace)):
                self.terminated_by_bridge = True
                if not self.args.ignore_term:
                    self.exit(-signal.SIGTERM)
                if not await self._exited_within(grace):
                    self.exit(-signal.SIGKILL)
            status = await self.wait()
        return status


class ScriptedSpawner:
    """Starts a :class:`ScriptedAgent` for each command of a fake agent in ``tests/``, in
    ``nursery``; without one, as a system task of the test's run, which trio cancels once
    the test has ended (as the fixtures reap a process left running)."""

    def __init__(self, nursery: trio.Nursery | None = None) -> None:
        self.nursery = nursery
        self.agents: list[ScriptedAgent] = []

    async def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], private_files: Sequence[str] = ()
    ) -> AgentHandle:
        agent = ScriptedAgent(argv, env)
        self.agents.append(agent)
        if self.nursery is None:
            trio.lowlevel.spawn_system_task(agent.run)
        else:
            self.nursery.start_soon(agent.run)
        return agent
