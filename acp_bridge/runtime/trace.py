"""``--trace FILE``: every frame as one JSON line with its direction and a timestamp.

System prompt text is replaced by its length unless the user asked for it, so a trace can
be shared in a bug report without leaking a persona or team instructions. Three layers
find that text:

* :func:`redact` removes the client's own forms (``systemPrompt``, ``_meta.systemPrompt``);
* the adapter in use names its own wire forms (:meth:`acp_bridge.adapter.Adapter.redact`),
  handed to the tracer as ``redactor`` once the adapter is chosen;
* as a safety net, any string equal to a prompt text the client sent in this run is
  redacted wherever it appears, so an adapter that forgets a form does not leak it.

The file is created 0600: even redacted, frames carry the user's conversation.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final

from acp_bridge.wire.jsonrpc import Batch, JsonObject, decode, encode

if TYPE_CHECKING:
    from pathlib import Path

REDACTED: Final = "<redacted>"
FILE_MODE: Final = 0o600

Redactor = Callable[[str, JsonObject], JsonObject]
"""``(direction, message) -> copy of message without prompt text``; never edits in place."""


def redacted_text(text: str) -> str:
    return f"{REDACTED} {len(text)} chars"


def _redact_prompt(value: Any) -> Any:
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, list):
            blocks = [
                {**b, "text": redacted_text(b["text"])}
                if isinstance(b, dict) and isinstance(b.get("text"), str)
                else b
                for b in content
            ]
            return {**value, "content": blocks}
        if isinstance(value.get("append"), str):
            return {**value, "append": REDACTED}
        return value
    if isinstance(value, str):
        return redacted_text(value)
    return value


def redact(message: Any) -> Any:
    """A copy of ``message`` without the client's system prompt forms: ``params.systemPrompt``,
    ``params._meta.systemPrompt`` (what clients send claude-agent-acp directly) and
    ``params._meta.system_prompt`` (the Python SDK's spelling)."""
    if isinstance(message, list):
        return [redact(item) for item in message]
    if not isinstance(message, dict) or not isinstance(message.get("params"), dict):
        return message
    params = dict(message["params"])
    if "systemPrompt" in params:
        params["systemPrompt"] = _redact_prompt(params["systemPrompt"])
    meta = params.get("_meta")
    if isinstance(meta, dict):
        for key in ("systemPrompt", "system_prompt"):
            if key in meta:
                meta = {**meta, key: _redact_prompt(meta[key])}
                params["_meta"] = meta
    return {**message, "params": params}


def redact_at(message: JsonObject, path: tuple[str | int, ...]) -> JsonObject:
    """A copy of ``message`` whose string at ``path`` (keys and list indexes) is redacted;
    ``message`` itself when nothing is there. For adapters naming their wire forms."""
    if not path:
        return message
    key, rest = path[0], path[1:]
    container: Any = message
    if isinstance(key, int):
        if not isinstance(container, list) or not -len(container) <= key < len(container):
            return message
    elif not isinstance(container, dict) or key not in container:
        return message
    value = container[key]
    changed: Any
    if rest:
        changed = redact_at(value, rest)
        if changed is value:
            return message
    elif isinstance(value, str):
        changed = redacted_text(value)
    else:
        return message
    copy: Any = list(container) if isinstance(container, list) else dict(container)
    copy[key] = changed
    result: JsonObject = copy
    return result


def prompt_texts(message: Any) -> set[str]:
    """The texts of a ``params.systemPrompt`` in a message: each block and their joined form
    (what adapters deliver)."""
    found: set[str] = set()
    items = message if isinstance(message, list) else [message]
    for item in items:
        params = item.get("params") if isinstance(item, dict) else None
        prompt = params.get("systemPrompt") if isinstance(params, dict) else None
        content = prompt.get("content") if isinstance(prompt, dict) else None
        if not isinstance(content, list):
            continue
        texts = [
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        ]
        found.update(texts)
        found.add("\n\n".join(texts))
    found.discard("")
    return found


def redact_texts(value: Any, texts: set[str] | frozenset[str]) -> Any:
    """``value`` with every string equal to one of ``texts`` redacted (a copy where changed)."""
    if not texts:
        return value
    # An explicit stack: a frame may be nested as deep as the JSON parser allowed.
    if isinstance(value, str):
        return redacted_text(value) if value in texts else value
    if not isinstance(value, (dict, list)):
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if isinstance(item, str):
            if item in texts:
                container[key] = redacted_text(item)
        elif isinstance(item, dict):
            copy = dict(item)
            container[key] = copy
            stack.extend((copy, k) for k in copy)
        elif isinstance(item, list):
            copy_list = list(item)
            container[key] = copy_list
            stack.extend((copy_list, i) for i in range(len(copy_list)))
    return root[0]


class TraceFileError(Exception):
    """The trace file cannot be opened; the message names it and why."""


def _open_private(path: Path) -> IO[bytes]:
    """Open ``path`` for appending, created 0600; an existing file is made 0600 too.

    Only a regular file of its own name: a symbolic link is not followed (its target is
    someone else's file to write and to chmod), and a FIFO or a device is refused without
    waiting for a reader (O_NONBLOCK).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TraceFileError(
                f"the trace file {path} is a symbolic link; give the path of the file itself"
            ) from None
        raise TraceFileError(f"cannot open the trace file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceFileError(f"the trace file {path} is not a regular file")
        os.set_blocking(fd, True)
        if info.st_mode & 0o777 != FILE_MODE:
            # A trace left by an older run, or a file the user created: ours to tighten.
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


class Tracer:
    def __init__(
        self,
        path: Path | None,
        *,
        include_prompts: bool = False,
        redactor: Redactor | None = None,
    ) -> None:
        self.include_prompts = include_prompts
        self.redactor = redactor
        """The adapter's own forms; the relay sets it once the adapter is chosen."""
        self._seen_prompts: set[str] = set()
        self._file: IO[bytes] | None = _open_private(path) if path else None

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, direction: str, raw: bytes, message: Any) -> None:
        if self._file is None:
            return
        if message is None:
            # A line the relay could not classify: still show it as JSON when it is JSON.
            try:
                message = decode(raw.decode())
            except (ValueError, RecursionError):
                message = None
        elif isinstance(message, Batch):
            message = list(message)  # written whole below anyway
        entry: dict[str, Any] = {"ts": time.time(), "dir": direction}
        if message is None:
            entry["raw"] = raw.decode(errors="replace")
        else:
            entry["frame"] = message if self.include_prompts else self.redact(direction, message)
        try:
            line = encode(entry)
        except ValueError:  # defensive: a value JSON cannot hold; the bytes still show
            line = encode({**entry, "frame": None, "raw": raw.decode(errors="replace")})
        self._file.write(line + b"\n")
        self._file.flush()

    def redact(self, direction: str, message: Any) -> Any:
        """What the trace shows of ``message`` when prompts are not included."""
        self._seen_prompts |= prompt_texts(message)
        message = redact(message)
        if self.redactor is not None:
            if isinstance(message, list):
                message = [
                    self.redactor(direction, m) if isinstance(m, dict) else m for m in message
                ]
            elif isinstance(message, dict):
                message = self.redactor(direction, message)
        return redact_texts(message, self._seen_prompts)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
