"""A scriptable fake ACP agent, run as a subprocess by the tests (stdlib only).

It records every line it receives (exact bytes) to ``--record`` and answers the ACP
methods the bridge cares about. Test-only methods steer it:

Version 2 of the protocol is answered in its own shape (``info``, ``capabilities``) when
the client asks for it; ``--caps`` is then the v2 ``capabilities`` object.

- ``_test/echo``: result is the params.
- ``_test/emit``: write ``params.lines`` (strings) to stdout verbatim, then answer.
- ``_test/exit``: exit at once with ``params.code``, answering nothing.
- ``_test/hang``: never answer.
- ``_test/ask_client``: send the client a request (``params.id``, ``params.method``),
  answer this request with the client's response once it arrives.
- ``_test/hold``: answer later, when ``_test/release`` arrives (result: the params), or
  with ``-32800`` when a ``$/cancel_request`` names its id.
- ``_test/release``: answer every held request, then this one.

``--sent`` records every line the agent writes to stdout, so tests can compare what the
client received with what the agent sent, byte for byte. ``--pidfile`` tells the tests
which process to look for after shutdown.

The answers are decided by :class:`Script`, which does no I/O: this file runs it over
stdin and stdout, and ``tests/memory_agent.py`` runs the same script as a coroutine over
in-memory streams, so both agents answer alike byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

# Most tests that start a process start this agent, so it starts on the standard library's
# cheapest modules: no argparse, dataclasses or typing (they pull in inspect, shutil,
# gettext and the like), subprocess only for a grandchild. A start and an answer took
# 22 ms of CPU under ``python -S`` (memory_agent.FAKE_PYTHON), 52 ms with them and site.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class Exit:
    """The agent ends at once with ``code``, answering nothing more."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code


# What the script does about one line: write these lines (without their newline), in
# order, and maybe exit after them.
Output = list["bytes | Exit"]


class Options:
    """The command line, as parsed by :func:`parse_args`."""

    def __init__(self) -> None:
        self.record: str | None = None
        self.name = "fake-agent"
        self.caps = "{}"  # agentCapabilities JSON
        self.ignore_eof = False
        self.ignore_term = False
        self.grandchild_pidfile: str | None = None
        # Start the grandchild in a session of its own, out of the agent's group.
        self.grandchild_own_session = False
        # The grandchild (in a session of its own) starts a child of its own once the
        # agent has exited, and writes its pid to <grandchild-pidfile>.late.
        self.grandchild_spawns_late = False
        self.fail_method: list[str] = []
        self.fail_message: str | None = None  # the error message of --fail-method's answers
        self.session_prefix = ""  # prefix of new session ids
        self.sent: str | None = None
        self.pidfile: str | None = None
        self.eof_exit_code = 0


FLAGS = ("--ignore-eof", "--ignore-term", "--grandchild-own-session", "--grandchild-spawns-late")
VALUED = (
    "--record",
    "--name",
    "--caps",
    "--grandchild-pidfile",
    "--fail-method",
    "--fail-message",
    "--session-prefix",
    "--sent",
    "--pidfile",
    "--eof-exit-code",
)


def parse_args(argv: Sequence[str]) -> Options:
    """``argv`` (without the program) as argparse would read these options: ``--x value``
    or ``--x=value``, a unique prefix for a name, ``--fail-method`` repeatable; anything
    else is an error (a ``ValueError``)."""
    options = Options()
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        name, equals, value = word.partition("=")
        matches = [o for o in (*FLAGS, *VALUED) if o == name] or [
            o for o in (*FLAGS, *VALUED) if o.startswith(name) and name.startswith("--")
        ]
        if len(matches) != 1:
            raise ValueError(f"fake agent: unknown or ambiguous option {word!r}")
        option = matches[0]
        attribute = option[2:].replace("-", "_")
        if option in FLAGS:
            if equals:
                raise ValueError(f"fake agent: {option} takes no value")
            setattr(options, attribute, True)
            continue
        if not equals:
            if not rest:
                raise ValueError(f"fake agent: {option} needs a value")
            value = rest.pop(0)
        if option == "--fail-method":
            options.fail_method.append(value)
        elif option == "--eof-exit-code":
            options.eof_exit_code = int(value)
        else:
            setattr(options, attribute, value)
    return options


class Script:
    """The fake agent's answers, line by line, without I/O."""

    def __init__(
        self,
        name: str = "fake-agent",
        caps: Any = None,
        fail_methods: Sequence[str] = (),
        session_prefix: str = "",
        fail_message: str | None = None,
    ) -> None:
        self.name = name
        self.caps = {} if caps is None else caps
        self.fail_methods = fail_methods
        self.session_prefix = session_prefix
        self.fail_message = fail_message
        self.counter = 0
        self.waiting: dict[Any, Any] = {}  # client-request id -> ours
        self.held: dict[Any, Any] = {}  # _test/hold request id -> params

    @classmethod
    def of(cls, args: Options) -> Script:
        caps = json.loads(args.caps)
        return cls(args.name, caps, args.fail_method, args.session_prefix, args.fail_message)

    def on_line(self, raw: bytes) -> Output:  # noqa: PLR0915 - one flat dispatch reads best
        out: Output = []

        def send(message: Any) -> None:
            out.append(json.dumps(message).encode())

        try:
            message = json.loads(raw)
        except ValueError:
            return out
        if isinstance(message, list):
            answers = [
                {"jsonrpc": "2.0", "id": m["id"], "result": {"batched": m.get("method")}}
                for m in message
                if isinstance(m, dict) and "method" in m and "id" in m
            ]
            if answers:
                send(answers)
            return out
        if not isinstance(message, dict):
            return out
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method is None:
            if request_id in self.waiting:
                original = self.waiting.pop(request_id)
                send({"jsonrpc": "2.0", "id": original, "result": {"clientSaid": message}})
            return out
        if "id" not in message:
            cancelled = params.get("requestId") if isinstance(params, dict) else None
            if (
                method == "$/cancel_request"
                and isinstance(cancelled, (int, str))
                and cancelled in self.held
            ):
                del self.held[cancelled]
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": cancelled,
                        "error": {"code": -32800, "message": "Request cancelled"},
                    }
                )
            return out

        def answer(result: Any, _id: Any = request_id) -> None:
            send({"jsonrpc": "2.0", "id": _id, "result": result})

        if method in self.fail_methods:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {
                        "code": -32603,
                        "message": self.fail_message or f"{method} failed on purpose",
                    },
                }
            )
        elif method == "initialize" and params.get("protocolVersion") == 2:
            answer(
                {
                    "protocolVersion": 2,
                    "info": {"name": self.name, "version": "1.0.0"},
                    "capabilities": self.caps,
                    "authMethods": [],
                }
            )
        elif method == "initialize":
            answer(
                {
                    "protocolVersion": params.get("protocolVersion", 1),
                    "agentCapabilities": self.caps,
                    "agentInfo": {"name": self.name, "version": "1.0.0"},
                    "authMethods": [],
                }
            )
        elif method in ("session/new", "session/fork"):
            self.counter += 1
            prefix = "sess" if method == "session/new" else "fork"
            answer({"sessionId": f"{self.session_prefix}{prefix}-{self.counter}"})
        elif method in ("session/load", "session/resume", "session/close", "session/delete"):
            answer({})
        elif method == "session/prompt":
            texts = [b.get("text") for b in params.get("prompt", []) if isinstance(b, dict)]
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": params.get("sessionId"),
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": json.dumps(texts)},
                        },
                    },
                }
            )
            answer({"stopReason": "end_turn"})
        elif method == "_test/echo":
            answer(params)
        elif method == "_test/emit":
            out.extend(line.encode() for line in params.get("lines", []))
            answer({})
        elif method == "_test/exit":
            out.append(Exit(int(params.get("code", 0))))
        elif method == "_test/hang":
            pass
        elif method == "_test/hold":
            self.held[request_id] = params
        elif method == "_test/release":
            for held_id, held_params in self.held.items():
                answer(held_params, held_id)
            self.held.clear()
            answer({})
        elif method == "_test/ask_client":
            self.waiting[params["id"]] = request_id
            send(
                {
                    "jsonrpc": "2.0",
                    "id": params["id"],
                    "method": params.get("method", "fs/read_text_file"),
                    "params": params.get("params", {}),
                }
            )
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )
        return out


def main() -> None:
    try:
        args = parse_args(sys.argv[1:])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)  # as argparse does
    out = sys.stdout.buffer
    sent_log = open(args.sent, "ab") if args.sent else None  # noqa: SIM115

    if args.pidfile:
        with open(args.pidfile, "w") as f:
            f.write(str(os.getpid()))
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild_pidfile:
        code = (
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)\n"
        )
        if args.grandchild_spawns_late:
            # codex's shell snapshot: a login shell in a session of its own whose profile
            # starts more processes (in its group) after the agent may have exited.
            # The agent's pid is written in, not read at the grandchild's start: an agent
            # told EOF at once may have exited before its grandchild's Python is up.
            code = (
                "import os, subprocess, sys, time\n"
                f"parent = {os.getpid()}\n"
                "while os.getppid() == parent:\n"
                "    time.sleep(0.01)\n"
                "late = subprocess.Popen(\n"
                "    [sys.executable, '-S', '-c', 'import time; time.sleep(3600)']\n"
                ")\n"
                f"open({args.grandchild_pidfile + '.late'!r}, 'w').write(str(late.pid))\n"
                "time.sleep(3600)\n"
            )
        import subprocess  # only a grandchild needs it

        child = subprocess.Popen(
            [sys.executable, "-S", "-c", code],
            stdin=subprocess.DEVNULL,
            start_new_session=args.grandchild_own_session,
        )
        with open(args.grandchild_pidfile, "w") as f:
            f.write(str(child.pid))
    record = open(args.record, "ab") if args.record else None  # noqa: SIM115
    script = Script.of(args)

    for raw in sys.stdin.buffer:
        if record is not None:
            record.write(raw if raw.endswith(b"\n") else raw + b"\n")
            record.flush()
        for item in script.on_line(raw):
            if isinstance(item, Exit):
                out.flush()
                os._exit(item.code)
            out.write(item + b"\n")
            if sent_log is not None:
                sent_log.write(item + b"\n")
                sent_log.flush()
        out.flush()

    if args.ignore_eof:
        while True:
            time.sleep(3600)
    out.flush()
    sys.exit(args.eof_exit_code)


if __name__ == "__main__":
    main()
