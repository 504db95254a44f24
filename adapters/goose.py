"""``goose``: the prompt goes through goose's own extension method, after each lifecycle step.

goose (``goose acp``, measured on 1.52.0) has no ``systemPrompt`` field. Its only route to
the system prompt is ``_goose/unstable/session/system-prompt/set``:

- ``mode: "append"`` with a ``key`` adds the text under goose's "Additional Instructions";
  the same key replaces it in place, empty text removes it.
- ``mode: "set"`` replaces goose's base prompt; blank text restores the default. The text
  is rendered as a MiniJinja template, and a template that fails to render is silently
  replaced by a fixed default, so the client's text is wrapped (:func:`protect_template`).

goose keeps both in memory only: ``session/close``, a goose restart and ``session/fork``
lose them. So the adapter applies the prompt after every successful ``session/new``,
``session/load`` and ``session/fork``, before the client sees the response, and tracks
what this goose process holds per session so that a changed prompt clears the other slot.
If goose refuses, the session the request created is deleted (a loaded one is closed)
and the client gets an error.

goose answers ``session/fork`` although it does not advertise it; the adapter advertises
``fork`` so that clients can use it. ``session/resume`` is not implemented by goose
(``-32601``) and is not advertised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final

from acp_bridge.adapter import (
    Adapter,
    AdapterContext,
    AgentError,
    AgentExited,
    Delivery,
    LifecycleCall,
    Reply,
)
from acp_bridge.core.capabilities import agent_name, is_v2
from acp_bridge.runtime.trace import redact_at
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonObject

if TYPE_CHECKING:
    # Named only: choosing this adapter (even before the bridge has loaded) must not
    # load the validation models.
    from acp_bridge.core.system_prompt import SystemPrompt

AGENT_NAME: Final = "goose"
SET_METHOD: Final = "_goose/unstable/session/system-prompt/set"

# MiniJinja's raw block ends at the first ``{%`` that opens an ``endraw`` tag, in any of
# its spellings (``{%endraw%}``, ``{%- endraw -%}``, ...). Cutting the text at every ``{%``
# and printing each one through an expression leaves nothing inside a raw block that
# could end it early.
_RAW_OPEN: Final = "{% raw %}"
_RAW_CLOSE: Final = "{% endraw %}"
_BLOCK_START: Final = "{%"
_BLOCK_START_EXPR: Final = '{{ "{%" }}'


def protect_template(text: str) -> str:
    """A MiniJinja template that renders to ``text`` exactly.

    Every run of text without ``{%`` goes into a raw block (so ``{{ … }}``, ``{# … #}`` and
    stray ``%}`` stay literal); each ``{%`` is printed by a string expression. The result
    never ends in a newline, which MiniJinja would otherwise drop from the template.
    """
    pieces: list[str] = []
    for index, chunk in enumerate(text.split(_BLOCK_START)):
        if index:
            pieces.append(_BLOCK_START_EXPR)
        if chunk:
            pieces.append(f"{_RAW_OPEN}{chunk}{_RAW_CLOSE}")
    return "".join(pieces)


class GoosePromptRefused(Exception):
    """goose did not take the system prompt (an error answer, or it exited)."""

    def __init__(self, cause: AgentError | AgentExited) -> None:
        super().__init__(str(cause))
        self.cause = cause

    def reply(self, what: str) -> Reply:
        data: JsonObject = (
            {"agentError": self.cause.error}
            if isinstance(self.cause, AgentError)
            else {"exitStatus": self.cause.status}
        )
        return Reply.failure(
            INTERNAL_ERROR, f"goose did not accept the system prompt, so {what}: {self}", data
        )


class GooseAdapter(Adapter):
    name = "goose"
    description = "goose acp: _goose/unstable/session/system-prompt/set after new/load/fork"

    append_key: ClassVar[str] = "acp-bridge"
    """The bridge's own key among goose's appended instructions (clients use their own)."""

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        # What this goose process holds in memory per session, as applied by this adapter.
        self.applied: dict[str, SystemPrompt] = {}

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        return agent_name(initialize_result) == AGENT_NAME

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=True)

    def redact(self, direction: str, message: JsonObject) -> JsonObject:
        """The text of the bridge's own system-prompt/set requests."""
        if message.get("method") != SET_METHOD:
            return message
        return redact_at(message, ("params", "text"))

    def adjust_capabilities(self, initialize_result: JsonObject) -> JsonObject:
        """Advertise ``fork``, which goose implements without advertising it."""
        caps_key, session_key = (
            ("capabilities", "session")
            if is_v2(initialize_result)
            else ("agentCapabilities", "sessionCapabilities")
        )
        caps = initialize_result.get(caps_key)
        if not isinstance(caps, dict):
            return initialize_result
        session = caps.get(session_key)
        if not isinstance(session, dict):
            # v2: no session object means no session methods at all; do not invent one.
            if is_v2(initialize_result):
                return initialize_result
            session = {}
        caps[session_key] = {"fork": {}, **session}
        return initialize_result

    # ------------------------------------------------------------------ lifecycle

    async def session_new(self, call: LifecycleCall) -> Reply:
        return await self._open(call, outcome="no session was created")

    async def session_fork(self, call: LifecycleCall) -> Reply:
        return await self._open(call, outcome="the session was not forked")

    async def _open(self, call: LifecycleCall, *, outcome: str) -> Reply:
        """session/new, session/fork: a session goose just made gets the prompt, or is deleted.

        ``outcome`` is what the client is told happened when goose refuses the prompt.
        """
        refused = self._refuse_blank_override(call.prompt)
        if refused is not None:
            return refused
        reply = await call.forward()
        session_id = _new_session_id(reply)
        if session_id is None or call.prompt is None:
            return reply
        try:
            await self._apply(call, session_id, call.prompt)
        except GoosePromptRefused as refused_by_goose:
            await self._discard(call, session_id, delete=True)
            return refused_by_goose.reply(outcome)
        return reply

    async def session_load(self, call: LifecycleCall) -> Reply:
        refused = self._refuse_blank_override(call.prompt)
        if refused is not None:
            return refused
        reply = await call.forward()
        session_id = call.session_id
        if not reply.ok or session_id is None:
            return reply
        try:
            await self._apply(call, session_id, call.prompt)
        except GoosePromptRefused as refused_by_goose:
            # The session existed before this request: close it, never delete it.
            await self._discard(call, session_id, delete=False)
            return refused_by_goose.reply("the session was not loaded")
        return reply

    async def session_close(self, call: LifecycleCall) -> Reply:
        reply = await call.forward()
        if reply.ok and call.session_id is not None:
            self.applied.pop(call.session_id, None)
        return reply

    async def session_delete(self, call: LifecycleCall) -> Reply:
        reply = await call.forward()
        if reply.ok and call.session_id is not None:
            self.applied.pop(call.session_id, None)
        return reply

    # ------------------------------------------------------------------- delivery

    def _refuse_blank_override(self, prompt: SystemPrompt | None) -> Reply | None:
        """goose restores its default prompt for blank ``set`` text: say so instead."""
        if prompt is None or prompt.mode != "override" or prompt.text.strip():
            return None
        return Reply.failure(
            INVALID_PARAMS,
            "goose cannot replace its system prompt with blank text.",
            {"field": "systemPrompt.content"},
        )

    async def _apply(
        self, call: LifecycleCall, session_id: str, prompt: SystemPrompt | None
    ) -> None:
        """Make goose's in-memory prompt for ``session_id`` be ``prompt`` (None: default)."""
        held = self.applied.get(session_id)
        if prompt is None:
            if held is not None:
                await self._clear(call, session_id, held)
            return
        if held is not None and held.mode != prompt.mode:
            await self._clear(call, session_id, held)
        text = prompt.text
        if prompt.mode == "override":
            if text != text.strip():
                self.log.warning(
                    "session %s: goose trims leading and trailing whitespace of an override",
                    session_id,
                )
            await self._set(call, session_id, {"mode": "set", "text": protect_template(text)})
        else:
            if not text.strip():
                self.log.warning(
                    "session %s: goose ignores blank appended text; nothing was appended",
                    session_id,
                )
            await self._set(
                call, session_id, {"mode": "append", "key": self.append_key, "text": text}
            )
        self.applied[session_id] = prompt

    async def _clear(self, call: LifecycleCall, session_id: str, held: SystemPrompt) -> None:
        if held.mode == "override":
            await self._set(call, session_id, {"mode": "set", "text": ""})
        else:
            await self._set(
                call, session_id, {"mode": "append", "key": self.append_key, "text": ""}
            )
        self.applied.pop(session_id, None)

    async def _set(self, call: LifecycleCall, session_id: str, params: JsonObject) -> None:
        try:
            await call.link.request(SET_METHOD, {"sessionId": session_id, **params})
        except (AgentError, AgentExited) as exc:
            self.log.warning(
                "session %s: goose refused %s (mode %s): %s",
                session_id,
                SET_METHOD,
                params.get("mode"),
                _describe(exc),
            )
            raise GoosePromptRefused(exc) from exc

    async def _discard(self, call: LifecycleCall, session_id: str, *, delete: bool) -> None:
        """Undo a lifecycle step whose prompt goose refused; log what cannot be undone."""
        self.applied.pop(session_id, None)
        methods = ("session/delete", "session/close") if delete else ("session/close",)
        for method in methods:
            try:
                await call.link.request(method, {"sessionId": session_id})
            except (AgentError, AgentExited) as exc:
                self.log.error("session %s: %s failed: %s", session_id, method, _describe(exc))
                if isinstance(exc, AgentExited):
                    return
            else:
                return


def _new_session_id(reply: Reply) -> str | None:
    result = reply.result
    if not reply.ok or not isinstance(result, dict):
        return None
    session_id = result.get("sessionId")
    return session_id if isinstance(session_id, str) else None


def _describe(exc: AgentError | AgentExited) -> str:
    if isinstance(exc, AgentError):
        data = exc.error.get("data")
        message = str(exc.error.get("message", "error"))
        return f"{exc.error.get('code')} {message}" + (f" ({data})" if data is not None else "")
    return str(exc)
