"""``--trace FILE``: every frame as one JSON line with its direction and a timestamp.

System prompt text is replaced by its length unless the user asked for it, so a trace can
be shared in a bug report without leaking a persona or team instructions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

REDACTED = "<redacted>"


def _redact_prompt(value: Any) -> Any:
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, list):
            blocks = [
                {**b, "text": f"{REDACTED} {len(b['text'])} chars"}
                if isinstance(b, dict) and isinstance(b.get("text"), str)
                else b
                for b in content
            ]
            return {**value, "content": blocks}
        if isinstance(value.get("append"), str):
            return {**value, "append": REDACTED}
        return value
    if isinstance(value, str):
        return f"{REDACTED} {len(value)} chars"
    return value


def redact(message: Any) -> Any:
    """A copy of ``message`` without system prompt text (request params and their _meta)."""
    if isinstance(message, list):
        return [redact(item) for item in message]
    if not isinstance(message, dict) or not isinstance(message.get("params"), dict):
        return message
    params = dict(message["params"])
    if "systemPrompt" in params:
        params["systemPrompt"] = _redact_prompt(params["systemPrompt"])
    meta = params.get("_meta")
    if isinstance(meta, dict) and "systemPrompt" in meta:
        params["_meta"] = {**meta, "systemPrompt": _redact_prompt(meta["systemPrompt"])}
    if isinstance(params.get("text"), str) and str(message.get("method", "")).endswith(
        "system-prompt/set"
    ):
        params["text"] = _redact_prompt(params["text"])
    return {**message, "params": params}


class Tracer:
    def __init__(self, path: Path | None, *, include_prompts: bool = False) -> None:
        self.include_prompts = include_prompts
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, direction: str, raw: bytes, message: Any) -> None:
        if self._file is None:
            return
        if message is None:
            try:
                message = json.loads(raw)
            except ValueError:
                message = None
        entry: dict[str, Any] = {"ts": time.time(), "dir": direction}
        if message is None:
            entry["raw"] = raw.decode(errors="replace")
        else:
            entry["frame"] = message if self.include_prompts else redact(message)
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
