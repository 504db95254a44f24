"""The session table of one client connection, and every lifecycle rule (spec §4-§6).

This module decides what happens to sessions and does no I/O. The runtime reads what is
stored for a session, runs the adapter's hook and writes to the store (off the event loop);
what it carries out comes from here as values: which client methods are intercepted, what
an intercepted request runs with (:class:`Step`), what must be stored once the agent has
answered it (:class:`Outcome`, a tuple of store writes), and what must be sent to the agent
when a store write fails (:class:`Withdraw`).

The rules:

* **What is intercepted.** ``initialize`` always: the adapter is chosen from its answer,
  and nothing passes before it. Once the adapter can deliver, the six session methods go
  through it (``session/new``, ``load``, ``resume``, ``fork``, ``close``, ``delete``), and
  ``session/prompt`` too when the adapter asks for it (first-turn delivery). Version 2 has
  no ``session/load`` (the prompt rides on new, resume and fork): whatever a client sends
  under that name there passes untouched. An adapter that cannot deliver (``passthrough``)
  gets nothing more: nothing is advertised or intercepted.
* **Whose sessions.** Sessions are stored per agent identity: the name the agent gives in
  its ``initialize`` answer (``agentInfo.name``; ``info.name`` in protocol version 2), else
  the name of its command.
* **What a request runs with.** A request that names a session (every one but
  ``session/new``; for ``session/fork`` the parent) first reads what is stored for it: the
  stored prompt is the request's ``previous`` and its prompt to begin with, the stored
  delivered fingerprint its ``delivered``.

  - On ``session/new``, ``load``, ``resume`` and ``fork`` the client's prompt (the
    ``systemPrompt`` param, else a prompt of the RFD's shape in ``_meta.systemPrompt``;
    ``null`` counts as omitted) is taken out of the params and validated (spec §5;
    ``override`` only where the delivery offers it, an agent's own ``_``-prefixed mode only
    where the adapter passes it on). A rejection names the field where the client put it,
    and the request goes no further: nothing is forwarded or stored.
  - A prompt omitted there is, under ``on_omitted: keep`` (the default), the one stored for
    the session (a fork: its parent's); under ``default``, none: the agent's own. A stored
    prompt this delivery cannot carry (stored under another adapter or policy: an agent's
    own mode, override before ``--no-override``) is not filled in: the agent's default
    applies, and that is logged.
  - ``session/close``, ``delete`` and ``prompt`` run with the stored prompt; their params
    are not touched.
* **What is stored, and when.** Only what the agent accepted; an error answer stores
  nothing (but see ``session/close``).

  - ``session/new``: the new id with the prompt, as a new conversation: an id the agent
    hands out again starts over, nothing delivered into it, no parent.
  - ``session/fork``: the new id likewise, with its parent. When the fork runs with the
    prompt already delivered into the parent's conversation, the fork's conversation holds
    it too: the delivered fingerprint is carried over.
  - ``session/load`` and ``resume``: the prompt the session now runs with (none under
    ``default`` when the client sent none); its conversation (delivered, parent) stays.
  - ``session/close``: the session is no longer live. An agent that answers ``-32002``
    (resource not found) has no such session open either: version 2 says a client should
    take that answer as a successful close. The client still gets the agent's answer.
  - ``session/delete``: the session is forgotten.
  - A prompt the adapter delivered into the conversation (``mark_delivered``, first-turn)
    becomes the delivered fingerprint of the session the request names.
  - A request the agent answered without a session id to record stores nothing.
* **Live.** A session is live from the moment its opening (new, load, resume, fork) is
  recorded until it is closed or deleted on this connection (adapters ask: claude closes a
  live session before reloading it with another prompt).
* **Withdrawing.** When a store write fails for a request that opened a session, or the
  adapter's own step fails after the agent accepted the request (its hook raises), no
  session may be left behind: nothing is stored, it is not live, the client gets a
  ``-32603`` error instead of the agent's answer, and the bridge ends the session in the
  agent with ``session/close`` where
  the agent offers it (version 1: ``sessionCapabilities.close``; version 2: every agent with
  ``capabilities.session``, where close is a baseline method), else ``session/delete``
  where offered (``sessionCapabilities.delete`` / ``capabilities.session.delete``), trying
  the next when one fails; a ``-32002`` answer counts as done. With neither offered the
  session stays open in the agent, and the runtime says so on stderr. A failed write for
  ``session/close`` or ``delete`` also answers ``-32603``; there is nothing to withdraw.
"""

from __future__ import annotations

import logging
from collections.abc import Set
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias

from acp_bridge.core import capabilities
from acp_bridge.core.system_prompt import (
    DEFAULT_MAX_PROMPT_BYTES,
    FIELD,
    PromptRejected,
    SystemPrompt,
    parse_system_prompt,
    same_json,
    take_system_prompt,
)
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, JsonObject, error_object

if TYPE_CHECKING:
    from acp_bridge.core.capabilities import Delivery

log = logging.getLogger("acp_bridge.sessions")

INITIALIZE: Final = "initialize"
SESSION_NEW: Final = "session/new"
SESSION_LOAD: Final = "session/load"
SESSION_RESUME: Final = "session/resume"
SESSION_FORK: Final = "session/fork"
SESSION_CLOSE: Final = "session/close"
SESSION_DELETE: Final = "session/delete"
SESSION_PROMPT: Final = "session/prompt"

OPENING: Final = frozenset({SESSION_NEW, SESSION_LOAD, SESSION_RESUME, SESSION_FORK})
"""The requests that open a session, and may carry a ``systemPrompt``."""
SESSION_METHODS: Final = OPENING | {SESSION_CLOSE, SESSION_DELETE}
"""The session methods an adapter that can deliver always sees."""

# ACP's "Resource not found"; for session/close, version 2 says to take it as closed.
RESOURCE_NOT_FOUND: Final = -32002

ON_OMITTED: Final = ("keep", "default")
"""``keep``: an omitted prompt is the stored one; ``default``: the agent's own."""


class StoredSession(Protocol):
    """What the store holds for a session, as far as the rules need it."""

    @property
    def prompt(self) -> SystemPrompt | None: ...

    @property
    def delivered(self) -> str | None: ...


# ----------------------------------------------------------------- store writes


@dataclass(frozen=True, slots=True)
class SaveSession:
    """Store the prompt a session runs with, and mark it live (owned by this process).

    ``new_conversation``: the agent has just created the session (new, fork), so nothing
    stored under that id before (delivered, parent) carries over."""

    session_id: str
    prompt: SystemPrompt | None
    parent_id: str | None = None
    new_conversation: bool = False


@dataclass(frozen=True, slots=True)
class MarkClosed:
    """The session is no longer live."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SetDelivered:
    """Which prompt (by fingerprint) is part of the session's conversation."""

    session_id: str
    fingerprint: str | None


@dataclass(frozen=True, slots=True)
class Forget:
    """Remove the session from the store."""

    session_id: str


StoreWrite: TypeAlias = SaveSession | MarkClosed | SetDelivered | Forget


# ------------------------------------------------------------------ decisions


@dataclass(frozen=True, slots=True)
class Step:
    """What one intercepted request runs with, before the adapter's hook sees it."""

    method: str
    session_id: str | None
    """The session the request names (for fork: the parent)."""
    params: JsonObject
    """The params to forward: a copy, with the client's prompt taken out where it was one."""
    prompt: SystemPrompt | None
    """The prompt the session runs with once the request succeeds."""
    previous: SystemPrompt | None
    """What the session (for fork: the parent) ran with before, from the store."""
    delivered: str | None
    """Fingerprint of the prompt already delivered into that conversation."""
    client_sent_prompt: bool
    """Whether the client put a prompt on this request (False: filled by ``on_omitted``)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What must be stored after the agent answered a request, in this order."""

    writes: tuple[StoreWrite, ...] = ()
    opened: str | None = None
    """A session the agent opened for the request: withdrawn if a write fails."""
    closed: str | None = None
    """A session the agent no longer has open."""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """End ``session_id`` in the agent: send ``{"sessionId": session_id}`` with each of
    ``methods`` in turn until one is done (see :meth:`done`); none: it stays open."""

    session_id: str
    methods: tuple[str, ...]

    @property
    def params(self) -> JsonObject:
        return {"sessionId": self.session_id}

    @staticmethod
    def done(error: JsonObject | None) -> bool:
        """Whether the session is gone after the agent answered with ``error`` (or not)."""
        return error is None or error.get("code") == RESOURCE_NOT_FOUND


@dataclass(frozen=True, slots=True)
class RecordFailed:
    """A store write failed: the error the client gets, and what the agent must be sent."""

    error: JsonObject
    withdraw: Withdraw | None


def intercepted_methods(
    delivery: Delivery | None, *, intercepts_prompt: bool, version_2: bool = False
) -> frozenset[str]:
    """The client methods the bridge handles itself, once the adapter is known."""
    methods = {INITIALIZE}
    if delivery is not None:
        methods |= SESSION_METHODS
        if version_2:
            methods.discard(SESSION_LOAD)  # version 2 has none: not the bridge's to change
        if intercepts_prompt:
            methods.add(SESSION_PROMPT)
    return frozenset(methods)


def withdraw_methods(initialize_result: JsonObject) -> tuple[str, ...]:
    """How a session can be ended in an agent with this ``initialize`` answer, best first."""
    offered = capabilities.session_capabilities(initialize_result)
    if capabilities.is_v2(initialize_result):
        # Version 2: `capabilities.session` itself promises the baseline, close included.
        session = capabilities.agent_capabilities(initialize_result).get("session")
        close = isinstance(session, dict)
    else:
        close = isinstance(offered.get("close"), dict)
    methods = [SESSION_CLOSE] if close else []
    if isinstance(offered.get("delete"), dict):
        methods.append(SESSION_DELETE)
    return tuple(methods)


def _named_session(params: Any) -> str | None:
    session_id = params.get("sessionId") if isinstance(params, dict) else None
    return session_id if isinstance(session_id, str) else None


class SessionTable:
    """The sessions of one client connection: the rules above, and which ones are live.

    ``agent`` is the identity sessions are stored under (the command's name until the
    agent's ``initialize`` answer gives its own); ``delivery`` what the adapter delivers
    after the ``--no-override`` policy, known once :meth:`initialized` was called.
    """

    def __init__(
        self,
        agent: str,
        *,
        on_omitted: str = "keep",
        max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES,
    ) -> None:
        if on_omitted not in ON_OMITTED:
            raise ValueError(
                f"on_omitted must be one of {', '.join(ON_OMITTED)}, not {on_omitted!r}"
            )
        self.agent = agent
        self.on_omitted = on_omitted
        self.max_prompt_bytes = max_prompt_bytes
        self.delivery: Delivery | None = None
        self.intercepted: frozenset[str] = frozenset({INITIALIZE})
        self._live: set[str] = set()
        # The last prompt a client sent that passed validation: its value as sent, the
        # delivery it was judged under, and the prompt it gave.
        self._last_prompt: tuple[object, Delivery, SystemPrompt] | None = None

    @property
    def live(self) -> Set[str]:
        """Sessions opened on this connection and not closed or deleted since."""
        return self._live

    def initialized(
        self,
        initialize_result: JsonObject,
        delivery: Delivery | None,
        *,
        intercepts_prompt: bool,
    ) -> frozenset[str]:
        """The agent answered ``initialize`` and the adapter said what it delivers: the
        methods intercepted from now on."""
        self.agent = capabilities.agent_name(initialize_result) or self.agent
        self.delivery = delivery
        self.intercepted = intercepted_methods(
            delivery,
            intercepts_prompt=intercepts_prompt,
            version_2=capabilities.is_v2(initialize_result),
        )
        return self.intercepted

    # --------------------------------------------------------- before the hook

    @staticmethod
    def reads(method: str, params: Any) -> str | None:
        """The session whose stored record :meth:`begin` needs (for fork: the parent)."""
        if method in (INITIALIZE, SESSION_NEW):
            return None
        return _named_session(params)

    def begin(self, method: str, params: JsonObject, stored: StoredSession | None) -> Step:
        """What ``method`` with ``params`` runs with; ``stored``: what :meth:`reads` named.

        Raises :class:`PromptRejected` (its field named where the client put the prompt)
        for a prompt the bridge refuses (spec §5).
        """
        previous = stored.prompt if stored is not None else None
        delivered = stored.delivered if stored is not None else None
        params = dict(params)
        prompt, sent = previous, False
        if method in OPENING:
            if self.delivery is None:
                raise RuntimeError(f"{method} reached the session table before initialize did")
            given = self._take_prompt(params)
            sent = given is not None
            if given is not None:
                prompt = given
            elif self.on_omitted == "default":
                prompt = None
            elif prompt is not None and not self.delivery.accepts(prompt.mode):
                log.warning(
                    "%s: the stored %s prompt of session %s cannot be delivered here; "
                    "the agent's default applies",
                    method,
                    prompt.mode,
                    _named_session(params),
                )
                prompt = None
        return Step(
            method=method,
            session_id=_named_session(params),
            params=params,
            prompt=prompt,
            previous=previous,
            delivered=delivered,
            client_sent_prompt=sent,
        )

    def _take_prompt(self, params: JsonObject) -> SystemPrompt | None:
        delivery = self.delivery
        assert delivery is not None
        raw, source = take_system_prompt(params)
        last = self._last_prompt
        if last is not None and last[1] is delivery and same_json(raw, last[0]):
            # The prompt the client sent last, again (the usual session/new of a seen
            # prompt): the same value under the same rules is valid and gives the same
            # prompt, whose fingerprint and stored form are already computed.
            return last[2]
        try:
            prompt = parse_system_prompt(
                raw,
                override_allowed=delivery.override,
                max_bytes=self.max_prompt_bytes,
                custom_modes=delivery.custom_modes,
            )
        except PromptRejected as rejected:
            if source == FIELD:
                raise
            # Named where the client put it (_meta.systemPrompt.content, ...).
            field = source + rejected.field.removeprefix(FIELD)
            raise replace(rejected, field=field) from None
        if prompt is not None:
            self._last_prompt = (raw, delivery, prompt)
        return prompt

    # ---------------------------------------------------------- after the hook

    def answered(
        self,
        step: Step,
        *,
        result: Any = None,
        error: JsonObject | None = None,
        delivered_now: str | None = None,
    ) -> Outcome:
        """What must be stored now that the client's answer is ``result`` or ``error``
        (``delivered_now``: the fingerprint the adapter marked delivered). Nothing changes
        here until :meth:`recorded` or :meth:`record_failed` is called."""
        session_id = step.session_id
        if error is not None:
            not_found = error.get("code") == RESOURCE_NOT_FOUND
            if step.method == SESSION_CLOSE and not_found and session_id is not None:
                return Outcome((MarkClosed(session_id),), closed=session_id)
            return Outcome()
        new_id = _named_session(result)
        writes: list[StoreWrite] = []
        opened = closed = None
        if step.method == SESSION_NEW and new_id is not None:
            opened = new_id
            writes.append(SaveSession(new_id, step.prompt, new_conversation=True))
        elif step.method == SESSION_FORK and new_id is not None:
            opened = new_id
            writes.append(
                SaveSession(new_id, step.prompt, parent_id=session_id, new_conversation=True)
            )
            if step.prompt is not None and step.delivered == step.prompt.fingerprint():
                writes.append(SetDelivered(new_id, step.delivered))
        elif session_id is None:
            return Outcome()
        elif step.method in (SESSION_LOAD, SESSION_RESUME):
            opened = session_id
            writes.append(SaveSession(session_id, step.prompt))
        elif step.method == SESSION_CLOSE:
            closed = session_id
            writes.append(MarkClosed(session_id))
        elif step.method == SESSION_DELETE:
            closed = session_id
            writes.append(Forget(session_id))
        if delivered_now is not None and session_id is not None:
            writes.append(SetDelivered(session_id, delivered_now))
        return Outcome(tuple(writes), opened=opened, closed=closed)

    def recorded(self, outcome: Outcome) -> None:
        """Every write of ``outcome`` is stored."""
        if outcome.closed is not None:
            self._live.discard(outcome.closed)
        if outcome.opened is not None:
            self._live.add(outcome.opened)

    def record_failed(
        self, outcome: Outcome, reason: str, initialize_result: JsonObject
    ) -> RecordFailed:
        """A write of ``outcome`` failed (``reason``): what the client gets instead of the
        agent's answer, and how to end a session the agent opened for it (its process
        answered ``initialize`` with ``initialize_result``)."""
        for session_id in (outcome.opened, outcome.closed):
            if session_id is not None:
                self._live.discard(session_id)
        if outcome.opened is None:
            message = f"The bridge could not record the session's change: {reason}"
            return RecordFailed(error_object(INTERNAL_ERROR, message), None)
        message = f"The bridge could not record the session, so it did not keep it open: {reason}"
        withdraw = Withdraw(outcome.opened, withdraw_methods(initialize_result))
        return RecordFailed(error_object(INTERNAL_ERROR, message), withdraw)

    def step_failed(
        self, step: Step, accepted: Any, initialize_result: JsonObject
    ) -> Withdraw | None:
        """The adapter's step for ``step`` failed after the agent accepted the forwarded
        request with ``accepted`` (its result): nothing is stored, and the session the agent
        opened for the request is not live and must be ended there (its process answered
        ``initialize`` with ``initialize_result``). ``None``: the agent opened none."""
        opened = self.answered(step, result=accepted).opened
        if opened is None:
            return None
        self._live.discard(opened)
        return Withdraw(opened, withdraw_methods(initialize_result))
