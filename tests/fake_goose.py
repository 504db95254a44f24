"""A fake ``goose acp`` (1.52.0) for unit tests, stdlib only, run as a subprocess or as a
coroutine (its :class:`Script`, by ``tests/memory_agent.py``).

It mimics what the adapter relies on, as measured on the real binary: the initialize
response, session ids, ``_goose/unstable/session/system-prompt/set`` with its validation
order and error strings, and the persistence rules (the prompt lives in memory only;
close, restart and fork lose it; load without close keeps it). Sessions are stored in a
JSON file (``--db``) so that a second process sees them, like goose's SQLite database.

The override "template" is rendered with a small subset of MiniJinja: ``{% raw %}`` blocks,
``{{ "string" }}`` and the ``current_date_time`` / ``goose_mode`` variables; anything else
that looks like a tag is a render error, which, like goose, silently yields a fixed default.

Test-only methods and options:

- ``_fake/system_prompt {sessionId}``: the system prompt the next turn would use.
- ``--record FILE``: every message received, one JSON line each.
- ``--refuse-set MODE``: answer every set call with that mode (``set``/``append``) with an
  error; ``--exit-on-set``: exit instead of answering a set; ``--refuse-delete``: answer
  ``session/delete`` with an error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_PROMPT = "You are goose, the default system prompt.\n\n# Extensions\n\n(none)"
FALLBACK_PROMPT = "You are a general-purpose AI agent called goose, created by Block"
SET_METHOD = "_goose/unstable/session/system-prompt/set"

INITIALIZE_RESULT = {
    "protocolVersion": 1,
    "agentCapabilities": {
        "loadSession": True,
        "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
        "mcpCapabilities": {"http": True, "sse": False},
        "sessionCapabilities": {"list": {}, "delete": {}, "close": {}},
        "auth": {},
        "_meta": {"goose": {"recipeParameterScopes": {}, "localInference": {}}},
    },
    "authMethods": [
        {
            "id": "goose-provider",
            "name": "Configure Provider",
            "description": "Run `goose configure` to set up your AI provider and API key",
        }
    ],
    "agentInfo": {"name": "goose", "version": "1.52.0"},
}

INVALID_PARAMS = -32602
NOT_FOUND = -32002


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid(data: str) -> RpcError:
    return RpcError(INVALID_PARAMS, "Invalid params", data)


def not_found(session_id: str) -> RpcError:
    return RpcError(NOT_FOUND, "Resource not found", f"Session not found: {session_id}")


_TAG = re.compile(r"\{%\s*raw\s*%\}(.*?)\{%-?\s*endraw\s*-?%\}|\{\{\s*(.*?)\s*\}\}|\{%|\{#", re.S)
_STRING = re.compile(r'"([^"\\]*)"')


def render(template: str) -> str:
    """The MiniJinja subset described in the module docstring; ValueError on anything else."""
    out: list[str] = []
    position = 0
    for match in _TAG.finditer(template):
        out.append(template[position : match.start()])
        position = match.end()
        if match.group(1) is not None:
            out.append(match.group(1))
            continue
        expression = match.group(2)
        if expression is None:
            raise ValueError("unsupported tag")
        string = _STRING.fullmatch(expression)
        if string is not None:
            out.append(string.group(1))
        elif expression == "current_date_time":
            out.append(datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
        elif expression == "goose_mode":
            out.append("auto")
        else:
            raise ValueError(f"unsupported expression {expression!r}")
    out.append(template[position:])
    return "".join(out)


class Goose:
    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self.args = args
        self.environ = environ
        self.db_path: str = args.db
        # In memory, per open session: {"override": str | None, "extras": {key: text}}.
        self.open: dict[str, dict[str, Any]] = {}

    # -- the stored sessions (the JSON file stands in for goose's sessions.db) ------------

    def load_db(self) -> dict[str, Any]:
        if not os.path.exists(self.db_path):
            return {"counter": 0, "sessions": {}}
        with open(self.db_path) as f:
            db: dict[str, Any] = json.load(f)
        return db

    def save_db(self, db: dict[str, Any]) -> None:
        with open(self.db_path, "w") as f:
            json.dump(db, f)

    def stored(self, session_id: str) -> dict[str, Any]:
        record = self.load_db()["sessions"].get(session_id)
        if record is None:
            raise not_found(session_id)
        return dict(record)

    def create(self, cwd: str) -> str:
        db = self.load_db()
        db["counter"] += 1
        session_id = f"{datetime.date.today():%Y%m%d}_{db['counter']}"
        db["sessions"][session_id] = {"cwd": cwd}
        self.save_db(db)
        self.open[session_id] = {"override": None, "extras": {}}
        return session_id

    def agent(self, session_id: str) -> dict[str, Any]:
        """The session's in-memory state; opened lazily for a stored session, like goose."""
        if session_id not in self.open:
            self.stored(session_id)
            self.open[session_id] = {"override": None, "extras": {}}
        return self.open[session_id]

    # -- methods ---------------------------------------------------------------------

    def handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            return INITIALIZE_RESULT
        if method == "session/new":
            cwd = params.get("cwd", "")
            if not os.path.isabs(cwd):
                raise invalid("cwd must be an absolute path")
            if not self.environ.get("GOOSE_PROVIDER"):
                raise RpcError(
                    -32603,
                    "Internal error",
                    "Failed to resolve provider: Configuration value not found: GOOSE_PROVIDER",
                )
            return {"sessionId": self.create(cwd), "_meta": {"workingDir": cwd}}
        if method == "session/load":
            session_id = params.get("sessionId", "")
            self.agent(session_id)
            return {"_meta": {}}
        if method == "session/fork":
            parent = self.stored(params.get("sessionId", ""))
            return {"sessionId": self.create(params.get("cwd", parent["cwd"]))}
        if method == "session/close":
            self.open.pop(params.get("sessionId", ""), None)
            return {}
        if method == "session/delete":
            session_id = params.get("sessionId", "")
            if self.args.refuse_delete:
                raise RpcError(-32603, "Internal error", "delete refused by the fake")
            db = self.load_db()
            db["sessions"].pop(session_id, None)
            self.save_db(db)
            self.open.pop(session_id, None)
            return {}
        if method == "session/list":
            sessions = self.load_db()["sessions"]
            return {
                "sessions": [
                    {"sessionId": sid, "cwd": record["cwd"], "title": "New Chat"}
                    for sid, record in sessions.items()
                ]
            }
        if method == "session/prompt":
            self.agent(params.get("sessionId", ""))
            return {"stopReason": "end_turn"}
        if method == SET_METHOD:
            return self.set_system_prompt(params)
        if method == "_fake/system_prompt":
            return {"system": self.system_prompt(params["sessionId"])}
        raise RpcError(-32601, "Method not found")

    def set_system_prompt(self, params: dict[str, Any]) -> Any:
        if "sessionId" not in params:
            raise invalid("missing field `sessionId`")
        if "text" not in params:
            raise invalid("missing field `text`")
        text = params["text"]
        if not isinstance(text, str):
            raise invalid("invalid type: null, expected a string")
        session_id = params["sessionId"]
        if not str(session_id).strip():
            raise invalid("sessionId cannot be empty")
        state = self.agent(session_id)
        mode = params.get("mode", "append")
        if mode is None:
            raise invalid("invalid type: null, expected string or map")
        if mode not in ("set", "append"):
            raise invalid(f"unknown variant `{mode}`, expected `set` or `append`")
        if self.args.exit_on_set:
            sys.exit(3)
        if mode in self.args.refuse_set:
            raise RpcError(-32603, "Internal error", f"{mode} refused by the fake")
        if mode == "set":
            state["override"] = text if text.strip() else None
            return {}
        key = (params.get("key") or "").strip()
        if not key:
            raise invalid("key cannot be empty for append mode")
        if text.strip():
            state["extras"][key] = text
        else:
            state["extras"].pop(key, None)
        return {}

    def system_prompt(self, session_id: str) -> str:
        state = self.agent(session_id)
        base = DEFAULT_PROMPT
        if state["override"] is not None:
            try:
                base = render(state["override"]).strip()
            except ValueError:
                base = FALLBACK_PROMPT
        extras = list(state["extras"].values())
        if not extras:
            return base
        return base + "\n\n# Additional Instructions:\n\n" + "\n\n".join(extras)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line after the program: ``acp`` and the options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--record")
    parser.add_argument("--refuse-set", action="append", default=[])
    parser.add_argument("--exit-on-set", action="store_true")
    parser.add_argument("--refuse-delete", action="store_true")
    return parser.parse_args(argv[1:] if argv[:1] == ["acp"] else argv)


class Script:
    """The fake goose's answers, line by line, without I/O (``tests/memory_agent.py`` runs
    it as a coroutine; :func:`main` over stdio). ``--exit-on-set`` raises ``SystemExit``."""

    def __init__(self, argv: Sequence[str], environ: Mapping[str, str]) -> None:
        self.args = parse_args(argv)
        self.goose = Goose(self.args, environ)
        if self.args.record:
            open(self.args.record, "a").close()

    def on_line(self, line: bytes) -> list[bytes]:
        if not line.strip():
            return []
        message = json.loads(line)
        if self.args.record:
            with open(self.args.record, "a") as record:
                record.write(json.dumps(message) + "\n")
        if "method" not in message or "id" not in message:
            return []
        try:
            answer: dict[str, Any] = {
                "result": self.goose.handle(message["method"], message.get("params") or {})
            }
        except RpcError as exc:
            error: dict[str, Any] = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            answer = {"error": error}
        return [json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}).encode()]


def main() -> None:
    script = Script(sys.argv[1:], os.environ)
    for line in sys.stdin.buffer:
        for out in script.on_line(line):
            sys.stdout.buffer.write(out + b"\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
