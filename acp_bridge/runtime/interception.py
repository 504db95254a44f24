"""Intercepted client requests carried out: one task each, from the router's ``Intercept``
to the answer the client gets.

:class:`Interceptions` owns the adapter (chosen once ``initialize`` is answered) and the
runtime's side of the session rules: for each intercepted request it reads the stored
session :class:`~acp_bridge.core.sessions.SessionTable` asks for, lets the table say what
the request runs with, hands a :class:`Call` to the adapter's hook, stores what the table
says the answer changed (off the event loop when the store may wait), and sends the
withdraw requests the table returns when that write fails or the hook fails after the
agent accepted the request. Every decision is the session
table's or the router's; this module only carries them out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio

from acp_bridge.adapter import HOOKS, Adapter, AgentError, AgentExited, AgentLink, Reply
from acp_bridge.core import capabilities
from acp_bridge.core.sessions import SessionTable, Step, Withdraw
from acp_bridge.core.system_prompt import PromptRejected, SystemPrompt
from acp_bridge.registry import AUTO, AdapterRegistry
from acp_bridge.runtime.adapter_context import LentContext
from acp_bridge.runtime.agents import Agents
from acp_bridge.runtime.connection import AgentConnection, Connection
from acp_bridge.runtime.trace import Tracer
from acp_bridge.state.lifecycle import Lifecycle
from acp_bridge.state.store import StoreError
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import Frame, JsonObject

log = logging.getLogger("acp_bridge")


class Call:
    """An intercepted client request on its way through an adapter hook (``LifecycleCall``).

    What it runs with (prompt, previous, delivered, the params to forward) is the session
    table's :class:`~acp_bridge.core.sessions.Step`; ``initialize`` has none.
    """

    def __init__(
        self,
        connection: Connection,
        token: int,
        frame: Frame,
        link: AgentConnection,
        step: Step | None = None,
    ) -> None:
        self.connection = connection
        self.token = token
        self.frame = frame
        self.method: str = frame.method or ""
        self.link = link
        self.original_params: JsonObject = frame.params
        self.params: JsonObject = dict(frame.params if step is None else step.params)
        self.prompt: SystemPrompt | None = None if step is None else step.prompt
        self.previous: SystemPrompt | None = None if step is None else step.previous
        self.session_id: str | None = None if step is None else step.session_id
        self.client_sent_prompt = False if step is None else step.client_sent_prompt
        self.delivered: str | None = None if step is None else step.delivered
        self.delivered_now: str | None = None
        self.forwarded_to: AgentConnection | None = None
        self.accepted: Reply | None = None
        """The agent's last successful answer to the forwarded request."""

    async def forward(self, link: AgentLink | None = None) -> Reply:
        if link is None:
            target = self.link
        elif isinstance(link, AgentConnection) and link.connection is self.connection:
            target = link
        else:
            raise TypeError(f"call.forward() got a link this bridge did not make: {link!r}")
        self.forwarded_to = target
        unchanged = self.params == self.original_params
        message = None if unchanged else {**self.frame.message, "params": self.params}
        connection = self.connection
        waiter, events = connection.router.forward(self.token, target.hop, message)
        connection.carry_out(events)
        answer = await connection.wait_for(waiter, target)
        if isinstance(answer, AgentExited):
            return Reply.internal(str(answer), {"exitStatus": answer.status})
        body = answer.message
        raw = answer.raw if body.get("id") == self.frame.id else None
        reply = Reply(result=body.get("result"), error=body.get("error"), frame_bytes=raw)
        if reply.ok:
            self.accepted = reply
        return reply

    def mark_delivered(self, fingerprint: str | None) -> None:
        self.delivered_now = fingerprint


class Interceptions:
    """The intercepted requests of one connection, and the adapter their hooks belong to."""

    def __init__(
        self,
        connection: Connection,
        agents: Agents[AgentConnection],
        lifecycle: Lifecycle,
        sessions: SessionTable,
        *,
        registry: AdapterRegistry,
        tracer: Tracer,
        adapter: str,
        allow_override: bool,
        adapter_options: Mapping[str, Mapping[str, Any]],
        start_soon: Callable[..., None],
    ) -> None:
        self.connection = connection
        self.agents = agents
        self.lifecycle = lifecycle
        self.sessions = sessions
        self.registry = registry
        self.tracer = tracer
        self.adapter_name = adapter
        self.allow_override = allow_override
        self.adapter_options = adapter_options
        self.start_soon = start_soon
        self.adapter: Adapter | None = None
        # The client's initialize params, replayed to every process started later.
        self.initialize_params: Any = None

    async def run(self, token: int, frame: Frame) -> None:
        """Carry out one intercepted request, and give the client its answer."""
        connection = self.connection
        try:
            reply = await self._handle(token, frame)
        except Exception as exc:
            log.exception("handling %s failed", frame.method)
            reply = Reply.internal(f"The bridge failed to handle {frame.method}.", str(exc))
        connection.carry_out(connection.router.answer(token, self._encode_reply(frame, reply)))
        connection.moved()
        await connection.flush_all()

    @staticmethod
    def _encode_reply(frame: Frame, reply: Reply) -> bytes:
        if reply.frame_bytes is not None:
            return reply.frame_bytes
        if reply.error is not None:
            return jsonrpc.encode(jsonrpc.error_answer(frame.id, reply.error))
        return jsonrpc.encode(jsonrpc.result_response(frame.id, reply.result))

    def _route_link(self, frame: Frame) -> AgentConnection:
        return self.agents.links[self.connection.router.hops.hop_for(frame.message)]

    async def _handle(self, token: int, frame: Frame) -> Reply:
        link = self._route_link(frame)
        if frame.method == "initialize":
            return await self._initialize(Call(self.connection, token, frame, link))
        assert self.adapter is not None
        method = frame.method or ""
        # What the named session (for fork: the parent) has been running with.
        named = self.sessions.reads(method, frame.params)
        stored = None if named is None else await self._store(self.lifecycle.get, named)
        try:
            step = self.sessions.begin(method, frame.params, stored)
        except PromptRejected as rejected:
            return Reply(error=rejected.error())
        call = Call(self.connection, token, frame, link, step)
        hook = getattr(self.adapter, HOOKS[call.method])
        try:
            reply: Reply = await hook(call)
        except Exception:
            await self._abandon(call, step)
            raise
        return await self._record(call, step, reply)

    async def _initialize(self, call: Call) -> Reply:
        self.initialize_params = call.frame.params
        reply = await call.forward()
        result = reply.result
        if not reply.ok or not isinstance(result, dict):
            return reply
        self.agents.primary.initialize_result = result
        if self.adapter is None:
            self._choose_adapter(result)
        assert self.adapter is not None
        # Each adapter names the wire forms it puts the prompt in, for the trace to hide.
        self.tracer.redactor = self.adapter.redact
        delivery, advertised = capabilities.initialize_answer(
            self.adapter, result, allow_override=self.allow_override
        )
        self.connection.router.configure(
            intercepted=self.sessions.initialized(
                result, delivery, intercepts_prompt=self.adapter.intercepts_prompt
            )
        )
        self.lifecycle.agent = self.sessions.agent
        log.info("adapter %s; delivery %s", self.adapter.name, delivery)
        if advertised is None:
            return reply
        return reply.with_result(advertised)

    def _choose_adapter(self, initialize_result: JsonObject) -> None:
        if self.adapter_name == AUTO:
            adapter_class = self.registry.choose(initialize_result)
        else:
            adapter_class = self.registry.get(self.adapter_name)
        self.adapter = adapter_class(
            LentContext(
                self.agents,
                live=lambda: self.sessions.live,
                place=self.connection.router.hops.place,
                unplace=self.connection.router.hops.unplace,
                start_soon=self.start_soon,
                adapter_options=self.adapter_options,
                log=log,
            )
        )

    async def _store(self, operation: Callable[..., Any], *args: Any) -> Any:
        """A call into the session store: off the event loop when it may wait on another
        process's lock, in place for an in-memory store (a thread would only add latency)."""
        if not self.lifecycle.store.may_wait:
            return operation(*args)
        return await trio.to_thread.run_sync(operation, *args)

    async def _record(self, call: Call, step: Step, reply: Reply) -> Reply:
        """Store what the session table says the answer changed; if that fails, no session
        the agent opened for this request may be left open."""
        outcome = self.sessions.answered(
            step, result=reply.result, error=reply.error, delivered_now=call.delivered_now
        )
        if outcome.writes:
            try:
                await self._store(self.lifecycle.apply, *outcome.writes)
            except StoreError as exc:
                log.error("%s: %s", call.method, exc)
                link = call.forwarded_to or call.link
                failed = self.sessions.record_failed(
                    outcome, str(exc), link.initialize_result or {}
                )
                if failed.withdraw is not None:
                    await self._withdraw(link, failed.withdraw)
                return Reply(error=failed.error)
        self.sessions.recorded(outcome)
        return reply

    async def _abandon(self, call: Call, step: Step) -> None:
        """The adapter's hook failed: end a session the agent opened for the request before
        the client gets the error."""
        if call.accepted is None:
            return
        link = call.forwarded_to or call.link
        withdraw = self.sessions.step_failed(
            step, call.accepted.result, link.initialize_result or {}
        )
        if withdraw is not None:
            await self._withdraw(link, withdraw)

    async def _withdraw(self, link: AgentConnection, withdraw: Withdraw) -> None:
        """End a session the agent opened for a request whose recording then failed."""
        for method in withdraw.methods:
            try:
                await link.request(method, withdraw.params)
                return
            except AgentExited:
                return  # the session went with the process
            except AgentError as exc:
                if withdraw.done(exc.error):
                    return
                log.warning("%s of session %s failed: %s", method, withdraw.session_id, exc)
        if withdraw.methods:
            log.warning("session %s stays open in the agent", withdraw.session_id)
        else:
            log.warning(
                "session %s stays open in the agent: it offers neither session/close "
                "nor session/delete",
                withdraw.session_id,
            )
