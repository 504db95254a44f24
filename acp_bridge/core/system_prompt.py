"""The ``systemPrompt`` object of the draft ACP feature: its model and its validation.

Validation follows the bridge specification's table (§5) and is answered by the bridge
itself, so a rejected request never reaches the agent. Everything here is sans-IO.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from acp_bridge.wire.jsonrpc import INVALID_PARAMS, JsonObject, error_object

log = logging.getLogger(__name__)

FIELD: Final = "systemPrompt"
# Large enough for any hand-written persona or team instructions, small enough that a
# prompt cannot crowd out the model's context or bloat the state database.
DEFAULT_MAX_PROMPT_BYTES: Final = 256 * 1024
# A prompt is a persona and some instruction files: a few blocks, or one per line of a
# 256 KiB prompt of 64-byte lines. Each block becomes a model object and a join; 4096 of them
# validate in about 15 ms, while a million (2 MB of blank lines) took 8 s.
MAX_PROMPT_BLOCKS: Final = 4096
# What joins two blocks in the delivered text (SystemPrompt.text).
BLOCK_JOIN: Final = "\n\n"
LIFECYCLE_METHODS: Final = ("session/new", "session/load", "session/resume", "session/fork")

Mode = Literal["append", "override"]
"""The modes the bridge itself delivers. A stored or passed-on prompt may carry an agent's
own ``_``-prefixed mode too (``parse_system_prompt``'s ``custom_modes``)."""


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class SystemPrompt(BaseModel):
    """A validated client prompt. Extra keys (``_meta`` and future ones) are kept."""

    # ``_meta`` is kept among the extra keys (parse_system_prompt checks it is an object): a
    # declared field would also claim a key named after its attribute, such as "meta".
    model_config = ConfigDict(extra="allow", frozen=True)

    mode: str
    content: tuple[TextBlock, ...]

    @property
    def meta(self) -> dict[str, Any] | None:
        """The prompt's ``_meta`` object, if it has one."""
        value = (self.model_extra or {}).get("_meta")
        return value if isinstance(value, dict) else None

    # The model is frozen, so what is derived from it is computed once per prompt: the pool
    # looks a prompt's process up by its fingerprint, and the store writes its JSON, on
    # every session/new.

    @cached_property
    def text(self) -> str:
        """The delivered text: blocks in order, joined with a blank line, nothing trimmed."""
        return BLOCK_JOIN.join(block.text for block in self.content)

    @cached_property
    def _fingerprint(self) -> str:
        digest = hashlib.sha256(f"{self.mode}\0{self.text}".encode())
        return digest.hexdigest()[:32]

    def fingerprint(self) -> str:
        """Identifies what reaches the model: mode and text, not ``_meta``."""
        return self._fingerprint

    def to_wire(self) -> JsonObject:
        # Python mode: JSON mode would encode strings as UTF-8 and fail on a lone surrogate
        # (valid JSON) in _meta or annotations; jsonrpc.encode writes those.
        wire: JsonObject = self.model_dump(mode="python")
        wire["content"] = list(wire["content"])
        return wire

    @cached_property
    def _wire_json(self) -> str:
        return json.dumps(self.to_wire())

    def wire_json(self) -> str:
        """:meth:`to_wire` as JSON text (ASCII, a lone surrogate escaped): what the store
        keeps."""
        return self._wire_json

    @classmethod
    def from_wire(cls, value: JsonObject) -> SystemPrompt:
        return cls.model_validate(value)

    @classmethod
    def of_text(cls, mode: Mode, *texts: str) -> SystemPrompt:
        return cls(mode=mode, content=tuple(TextBlock(type="text", text=t) for t in texts))


@dataclass(frozen=True)
class PromptRejected(Exception):
    """A client ``systemPrompt`` the bridge refuses; becomes a ``-32602`` error response."""

    message: str
    field: str
    code: int = INVALID_PARAMS

    def error(self) -> JsonObject:
        return error_object(self.code, self.message, {"field": self.field})


def parse_system_prompt(
    value: object,
    *,
    override_allowed: bool,
    max_bytes: int = DEFAULT_MAX_PROMPT_BYTES,
    custom_modes: Collection[str] = (),
) -> SystemPrompt | None:
    """Validate a ``systemPrompt`` value from request params; ``None`` means none was given.

    ``custom_modes``: ``_``-prefixed modes the agent advertises itself and the adapter
    passes on untouched; any other mode than append and override is refused (the schema:
    an unsupported mode is an error, never taken as append or override).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PromptRejected("The systemPrompt must be an object with mode and content.", FIELD)
    mode = value.get("mode")
    if not isinstance(mode, str):
        raise PromptRejected("The systemPrompt mode must be a string.", f"{FIELD}.mode")
    if mode not in ("append", "override") and mode not in custom_modes:
        raise PromptRejected(f"The systemPrompt mode {mode!r} is not supported.", f"{FIELD}.mode")
    if mode == "override" and not override_allowed:
        raise PromptRejected(
            "The systemPrompt mode 'override' is not supported by this agent.", f"{FIELD}.mode"
        )
    content = value.get("content")
    if not isinstance(content, list):
        raise PromptRejected("The systemPrompt content must be an array.", f"{FIELD}.content")
    if not content:
        raise PromptRejected("The systemPrompt content must not be empty.", f"{FIELD}.content")
    if len(content) > MAX_PROMPT_BLOCKS:
        raise PromptRejected(
            f"The systemPrompt content has {len(content)} blocks, where at most "
            f"{MAX_PROMPT_BLOCKS} blocks are accepted.",
            f"{FIELD}.content",
        )
    # What is delivered: every block and the blank line that joins it to the next.
    total = len(BLOCK_JOIN) * (len(content) - 1)
    for index, block in enumerate(content):
        where = f"{FIELD}.content[{index}]"
        if not isinstance(block, dict):
            raise PromptRejected("Each systemPrompt content block must be an object.", where)
        if block.get("type") != "text":
            kind = block.get("type")
            raise PromptRejected(
                f"Only text blocks are supported in systemPrompt content, not {kind!r}.",
                f"{where}.type",
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise PromptRejected("A systemPrompt text block needs a string text.", f"{where}.text")
        for key in ("annotations", "_meta"):  # optional objects of the schema's TextContent
            if block.get(key) is not None and not isinstance(block[key], dict):
                raise PromptRejected(
                    f"The {key} of a systemPrompt text block must be an object.", f"{where}.{key}"
                )
        try:
            total += len(text.encode())
        except UnicodeEncodeError:
            # Valid JSON ("\\ud800") but not text: no agent or model could receive it as sent.
            raise PromptRejected(
                "A systemPrompt text block holds a lone surrogate, which is not valid text.",
                f"{where}.text",
            ) from None
    if total > max_bytes:
        raise PromptRejected(
            f"The systemPrompt text is {total} bytes as delivered (blocks joined by a blank "
            f"line), more than the limit of {max_bytes}.",
            f"{FIELD}.content",
        )
    meta = value.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        raise PromptRejected("The systemPrompt _meta must be an object.", f"{FIELD}._meta")
    try:
        return SystemPrompt.model_validate(value)
    except ValidationError as exc:
        # The checks above cover the schema; this names the field should the model differ.
        location = exc.errors()[0]["loc"] if exc.errors() else ()
        field = FIELD + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in location)
        raise PromptRejected("The systemPrompt does not match the schema.", field) from None


def same_json(first: object, second: object) -> bool:
    """Whether two decoded JSON values are the same value: equal, with every member of the
    same type (Python's ``==`` takes ``1``, ``1.0`` and ``true`` for equal, JSON does not),
    and objects with the same keys."""
    if type(first) is not type(second):
        return False
    if isinstance(first, dict):
        assert isinstance(second, dict)
        return first.keys() == second.keys() and all(
            same_json(value, second[key]) for key, value in first.items()
        )
    if isinstance(first, list):
        assert isinstance(second, list)
        return len(first) == len(second) and all(map(same_json, first, second))
    return first == second


META_FIELD: Final = "_meta.systemPrompt"
# What the Python SDK (agent-client-protocol 0.12) makes of ``system_prompt=`` on
# new_session and the others: unknown keywords go into _meta under the name given.
META_SNAKE_KEY: Final = "system_prompt"
META_SNAKE_FIELD: Final = "_meta.system_prompt"


def take_system_prompt(params: JsonObject) -> tuple[object | None, str]:
    """Remove the client's prompt from lifecycle request ``params``; return it unvalidated
    with the wire path it came from (``systemPrompt``, ``_meta.systemPrompt`` or
    ``_meta.system_prompt``).

    The standard ``systemPrompt`` param wins (``null`` counts as absent). Without it, a
    ``_meta.systemPrompt`` of the RFD's shape (an object with ``mode`` and ``content``) is
    the prompt too: SDK clients whose schema predates the field put it there. Then any
    non-null ``_meta.system_prompt``, the Python SDK's spelling: no agent reads that key,
    so whatever is there was meant as the prompt and is refused rather than lost when it
    is not a valid one.

    Validate the value with :func:`parse_system_prompt` like the standard one; an error's
    field path then starts with the returned source instead of ``systemPrompt``. Only that
    key leaves ``_meta``: the client's other ``_meta`` keys are forwarded as sent, and a
    ``_meta`` that held nothing else is dropped. Any other ``_meta.systemPrompt``
    (claude-agent-acp's own string or ``{append}`` forms) is not a prompt for the bridge
    and stays in place. ``(None, "systemPrompt")``: no prompt.
    """
    standard = params.pop(FIELD, None)
    if standard is not None:
        return standard, FIELD
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return None, FIELD
    value = meta.get(FIELD)
    if isinstance(value, dict) and "mode" in value and "content" in value:
        key, source = FIELD, META_FIELD
    elif meta.get(META_SNAKE_KEY) is not None:
        key, source = META_SNAKE_KEY, META_SNAKE_FIELD
        value = meta[key]
    else:
        return None, FIELD
    rest = {name: item for name, item in meta.items() if name != key}
    if rest:
        params["_meta"] = rest
    else:
        del params["_meta"]
    log.debug("systemPrompt taken from %s (a client that predates the field)", source)
    return value, source
