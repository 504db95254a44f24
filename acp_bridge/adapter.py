"""The adapter interface: how a backend agent receives the client's system prompt.

The relay owns the wire, the id tables and the session store. An adapter only says what
it can deliver (:meth:`Adapter.delivery`) and what its agent needs at each lifecycle step,
through the hooks below. Every hook gets a :class:`LifecycleCall`, may edit
``call.params``, must call ``await call.forward()`` to let the request reach the agent
(or answer without forwarding), and returns the :class:`Reply` the client should get.
Until the hook returns, the client does not see the response: an adapter can finish its
own work with the agent first (``call.link.request(...)``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple, Protocol

# Re-exported: adapters name Delivery through the adapter interface.
from acp_bridge.core.capabilities import Delivery as Delivery  # noqa: PLC0414
from acp_bridge.core.exits import describe_exit
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, JsonObject, error_object

if TYPE_CHECKING:
    import logging

    # Only named here: the bridge answers ``initialize`` before the validation models
    # (pydantic) are loaded, and choosing an adapter must not load them.
    from acp_bridge.core.system_prompt import SystemPrompt


class ReopenLimit(str):
    """One documented limit of reopening a session with another prompt: the sentence
    itself, plus what the model then receives instead, so ``verify`` can tell the limit
    from a delivery failure.

    ``receives``: prompts whose text still reaches the model though they were not asked for
    (e.g. ``previous``). ``receives_created``: the prompt the session was created with still
    reaches it; the bridge may no longer know that prompt (codex keeps it under a later
    override), so it is named, not given. ``misses``: prompts asked for whose text does not
    reach the model. A plain ``str`` from an adapter written before this class means the
    common case, :meth:`of` spells it out: the previous prompt is still there and the new
    one is not.
    """

    receives: tuple[SystemPrompt, ...]
    receives_created: bool
    misses: tuple[SystemPrompt, ...]

    def __new__(
        cls,
        reason: str,
        *,
        receives: Sequence[SystemPrompt] = (),
        receives_created: bool = False,
        misses: Sequence[SystemPrompt] = (),
    ) -> ReopenLimit:
        limit = super().__new__(cls, reason)
        limit.receives = tuple(receives)
        limit.receives_created = receives_created
        limit.misses = tuple(misses)
        return limit

    @classmethod
    def of(
        cls, limit: str, previous: SystemPrompt | None, prompt: SystemPrompt | None
    ) -> ReopenLimit:
        """``limit`` as a :class:`ReopenLimit`; a plain sentence gets the common case."""
        if isinstance(limit, ReopenLimit):
            return limit
        return cls(
            limit,
            receives=(previous,) if previous is not None else (),
            misses=(prompt,) if prompt is not None else (),
        )


class AgentError(Exception):
    """The agent answered a request with a JSON-RPC error."""

    def __init__(self, error: JsonObject) -> None:
        super().__init__(error.get("message", "agent error"))
        self.error = error


class AgentExited(Exception):
    """The agent process is gone; ``status`` is its exit status when known."""

    def __init__(self, status: int | None) -> None:
        super().__init__(describe_exit(status))
        self.status = status


class AgentLink(Protocol):
    """One running agent process, as adapters see it."""

    @property
    def name(self) -> str: ...

    @property
    def initialize_result(self) -> JsonObject | None: ...

    @property
    def closed(self) -> bool:
        """True once the process has exited."""

    async def wait_closed(self) -> None:
        """Return once the process has exited (at once if it has)."""

    async def request(self, method: str, params: JsonObject) -> Any:
        """Send a request of the bridge's own; return its result or raise AgentError/AgentExited."""

    async def notify(self, method: str, params: JsonObject) -> None: ...


class Reply(NamedTuple):
    """The answer the client gets for an intercepted request (immutable).

    ``frame_bytes`` is set while the reply is exactly what the agent sent, so the relay
    can forward those bytes; :meth:`with_result` and :meth:`failure` make changed replies.
    """

    result: Any = None
    error: JsonObject | None = None
    frame_bytes: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def with_result(self, result: Any) -> Reply:
        return Reply(result=result)

    @classmethod
    def failure(cls, code: int, message: str, data: Any = None) -> Reply:
        return cls(error=error_object(code, message, data))

    @classmethod
    def internal(cls, message: str, data: Any = None) -> Reply:
        return cls.failure(INTERNAL_ERROR, message, data)


class LifecycleCall(Protocol):
    """A client request the relay intercepted, handed to an adapter hook."""

    method: str
    params: JsonObject
    """The params that will be forwarded, ``systemPrompt`` already removed; edit freely."""
    original_params: JsonObject
    """The params exactly as the client sent them."""
    prompt: SystemPrompt | None
    """The prompt the session runs with once this call succeeds (after the on_omitted policy)."""
    previous: SystemPrompt | None
    """What the session (for fork: the parent) was using before, from the store."""
    session_id: str | None
    """The session the request names (for fork: the parent)."""
    client_sent_prompt: bool
    """Whether the client put a systemPrompt on this request (False: filled by policy)."""
    delivered: str | None
    """Fingerprint of the prompt already delivered into this conversation (first-turn)."""
    link: AgentLink

    async def forward(self, link: AgentLink | None = None) -> Reply:
        """Send the (possibly edited) request to the agent and wait for its response.

        ``link`` must be one the bridge made (``context.primary``, ``call.link`` or a
        process from ``context.spawn_agent``); any other object raises ``TypeError``.
        """

    def mark_delivered(self, fingerprint: str | None) -> None:
        """Record which prompt is now part of the conversation (first-turn delivery)."""


def put_prompt_back(call: LifecycleCall) -> None:
    """The native route: give the agent the ``systemPrompt`` field the bridge took out of
    ``call.params`` — the client's value as sent (unknown keys included), or the prompt
    the ``on_omitted`` policy filled in (or an older client sent in ``_meta``)."""
    if call.client_sent_prompt and "systemPrompt" in call.original_params:
        call.params["systemPrompt"] = call.original_params["systemPrompt"]
    elif call.prompt is not None:
        call.params["systemPrompt"] = call.prompt.to_wire()


class AdapterContext(Protocol):
    """What the relay lends an adapter."""

    log: logging.Logger

    @property
    def primary(self) -> AgentLink:
        """The agent process started first; it answers everything not routed elsewhere."""

    def live_sessions(self) -> set[str]:
        """Sessions opened through this bridge and not closed since, in this agent process."""

    def agent_environment(self) -> Mapping[str, str]:
        """The environment agent processes start with: the bridge's plus the configured one."""

    async def spawn_agent(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> AgentLink:
        """Start another process of the same agent, replaying the client's initialize.

        ``private_files`` (files or folders with prompt text the process reads) are removed
        by the process's watchdog should the bridge be killed."""

    async def stop_agent(self, link: AgentLink) -> None:
        """Stop a process started with :meth:`spawn_agent` (EOF, grace, SIGTERM, SIGKILL)."""

    def place_session(self, session_id: str, link: AgentLink) -> None:
        """Session ``session_id`` lives in ``link`` (the primary or a process from
        :meth:`spawn_agent`): the client's frames naming it go there from now on. Say it
        before the hook that opened or moved the session returns."""

    def unplace_session(self, session_id: str) -> None:
        """Session ``session_id`` is gone (closed, deleted): the client's frames naming it
        go to the primary again. A process that exits takes its sessions with it."""

    def start_soon(self, async_fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run background work (timers, reapers) for as long as the connection lives."""

    def adapter_options(self, adapter: str) -> Mapping[str, Any]:
        """The configured options of an adapter (``bridge.adapter_options.<name>``)."""


HOOKS: Final = {
    "session/new": "session_new",
    "session/load": "session_load",
    "session/resume": "session_resume",
    "session/fork": "session_fork",
    "session/close": "session_close",
    "session/delete": "session_delete",
    "session/prompt": "session_prompt",
}
"""The client methods the bridge hands to an adapter, and the hook each one calls."""
HOOK_NAMES: Final = frozenset(HOOKS.values())


class Adapter:
    """Base adapter: forwards everything unchanged. Subclasses override what they need."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    intercepts_prompt: ClassVar[bool] = False
    """Whether ``session_prompt`` is called; otherwise prompts pass by untouched."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Misspelt hooks are caught when the adapter is defined, not silently skipped."""
        super().__init_subclass__(**kwargs)
        for attribute in vars(cls):
            if attribute.startswith("session_") and attribute not in HOOK_NAMES:
                raise TypeError(
                    f"{cls.__name__}.{attribute} is not an adapter hook; the hooks are "
                    + ", ".join(sorted(HOOK_NAMES))
                )
        if cls.route is not Adapter.route:
            _place_by_route(cls)

    def __init__(self, context: AdapterContext) -> None:
        self.context = context
        self.log = context.log.getChild(self.name or type(self).__name__)

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        """Whether this adapter fits an agent, judged from its initialize response."""
        return False

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        """What can be delivered to this agent; ``None``: advertise and intercept nothing."""
        return Delivery()

    @classmethod
    def reopen_limits(
        cls, previous: SystemPrompt | None, prompt: SystemPrompt | None
    ) -> Sequence[str]:
        """What of ``prompt`` cannot reach the model when a session that ran with
        ``previous`` is loaded or resumed with it: one :class:`ReopenLimit` (a sentence
        that also says what the model then receives) per documented limit.

        The adapter logs these when they happen. ``verify`` shows a row that hits one as
        LIMIT only when the model received what the limits say, and as FAIL otherwise.
        """
        return []

    @classmethod
    def fork_limits(cls, parent: SystemPrompt | None, prompt: SystemPrompt | None) -> Sequence[str]:
        """What of ``prompt`` cannot reach the model when a session that ran with
        ``parent`` is forked with it (an agent whose fork copies the parent's instructions
        with its history): :class:`ReopenLimit` sentences, as for :meth:`reopen_limits`."""
        return []

    def redact(self, direction: str, message: JsonObject) -> JsonObject:
        """``message`` as ``--trace`` may show it: a copy without the prompt text in this
        adapter's own wire forms (``acp_bridge.runtime.trace.redact_at`` helps). Never edit
        in place.

        ``direction`` is the trace's (``"bridge->agent"``, ``"agent->client"``, …). The
        client's own forms (``systemPrompt``, ``_meta.systemPrompt``) are already redacted
        by the tracer before this is called, whatever the adapter does.
        """
        return message

    @classmethod
    def broken_methods(cls, initialize_result: JsonObject) -> dict[str, str]:
        """Methods this agent version advertises but that fail upstream: method -> reason.

        The bridge still passes them on and the agent's answer back (nothing is hidden);
        ``verify`` shows their steps as SKIP with the reason instead of as a failure.
        """
        return {}

    def adjust_capabilities(self, initialize_result: JsonObject) -> JsonObject:
        """Change what the agent advertises beyond systemPrompt (e.g. a method it really has)."""
        return initialize_result

    def route(self, method: str, params: Any) -> AgentLink | None:
        """Deprecated: say where a session lives with ``context.place_session`` instead.

        The bridge no longer asks an adapter while it routes. An adapter that still defines
        this is asked once per session after each of its hooks returns (with the hook's
        method, and its params naming that session), and the answer is placed for it; a
        frame that names no session goes to the primary.
        """
        return None

    async def session_new(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_load(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_resume(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_fork(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_close(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_delete(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def session_prompt(self, call: LifecycleCall) -> Reply:
        return await call.forward()

    async def aclose(self) -> None:
        """The connection is ending: release what the adapter holds."""


def _place_by_route(cls: type[Adapter]) -> None:
    """Keep an adapter written against the deprecated :meth:`Adapter.route` working: after
    each hook, where ``route`` says each session the call named or opened lives is placed
    through the context, as a current adapter does itself."""
    if "route" in vars(cls):
        warnings.warn(
            f"{cls.__name__}.route is deprecated: the bridge places sessions where "
            "context.place_session() says (see docs/writing-adapters.md)",
            DeprecationWarning,
            stacklevel=3,
        )
    for name in HOOK_NAMES:
        hook = getattr(cls, name)
        if not getattr(hook, "_places_by_route", False):
            setattr(cls, name, _placing(hook))


def _placing(
    hook: Callable[[Any, LifecycleCall], Awaitable[Reply]],
) -> Callable[[Any, LifecycleCall], Awaitable[Reply]]:
    @functools.wraps(hook)
    async def placing(self: Adapter, call: LifecycleCall) -> Reply:
        reply = await hook(self, call)
        named = [call.session_id]
        if isinstance(reply.result, dict):
            named.append(reply.result.get("sessionId"))
        for session_id in dict.fromkeys(n for n in named if isinstance(n, str)):
            link = self.route(call.method, {**call.params, "sessionId": session_id})
            if link is None:
                self.context.unplace_session(session_id)
            else:
                self.context.place_session(session_id, link)
        return reply

    placing._places_by_route = True  # type: ignore[attr-defined]
    return placing
