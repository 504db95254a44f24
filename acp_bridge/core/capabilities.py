"""What the bridge advertises to the client in the ``initialize`` response (spec §4).

Sans-IO: takes the agent's result and returns the result the client gets. Every key the
agent sent is kept; only ``systemPrompt`` and the bridge's ``_meta`` entry are added.
:func:`initialize_answer` is the one place that turns an adapter's delivery into that
answer: the runtime and the early exchange (:mod:`acp_bridge.runtime.early_initialize`) both use it.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple, Protocol

from acp_bridge import __version__
from acp_bridge.wire.jsonrpc import JsonObject

BRIDGE_META_KEY = "acp-bridge"


class Delivery(NamedTuple):
    """What an adapter can really deliver to its agent (immutable: ``_replace`` makes a
    changed copy)."""

    append: bool = True
    override: bool = False
    custom_modes: tuple[str, ...] = ()
    """Modes of the agent's own (``_``-prefixed, advertised in its capability's ``mode``
    map) that the adapter passes on untouched: the schema leaves them to implementations."""

    def accepts(self, mode: str) -> bool:
        """Whether a prompt in ``mode`` can be delivered."""
        if mode == "append":
            return self.append
        if mode == "override":
            return self.override
        return mode in self.custom_modes


class Advertiser(Protocol):
    """What the answer to ``initialize`` needs of an adapter
    (:class:`acp_bridge.adapter.Adapter` has it)."""

    @property
    def name(self) -> str: ...

    def delivery(self, initialize_result: JsonObject) -> Delivery | None: ...

    def adjust_capabilities(self, initialize_result: JsonObject) -> JsonObject: ...


def is_v2(initialize_result: JsonObject) -> bool:
    return initialize_result.get("protocolVersion") == 2


def agent_capabilities(initialize_result: JsonObject) -> JsonObject:
    key = "capabilities" if is_v2(initialize_result) else "agentCapabilities"
    caps = initialize_result.get(key)
    return caps if isinstance(caps, dict) else {}


def session_capabilities(initialize_result: JsonObject) -> JsonObject:
    key = "session" if is_v2(initialize_result) else "sessionCapabilities"
    caps = agent_capabilities(initialize_result).get(key)
    return caps if isinstance(caps, dict) else {}


def native_modes(initialize_result: JsonObject) -> JsonObject:
    """The agent's own ``systemPrompt.mode`` map: mode name -> its (object) capability."""
    advertised = session_capabilities(initialize_result).get("systemPrompt")
    modes = advertised.get("mode") if isinstance(advertised, dict) else None
    if not isinstance(modes, dict):
        return {}
    # An object advertises a mode; null or anything else does not (the schema's reading).
    return {name: value for name, value in modes.items() if isinstance(value, dict)}


def native_delivery(initialize_result: JsonObject) -> Delivery | None:
    """What the agent itself advertises for systemPrompt, if anything.

    Its ``_``-prefixed modes are the implementation's own (the schema reserves them so):
    an adapter that passes the field on may pass those too.
    """
    advertised = session_capabilities(initialize_result).get("systemPrompt")
    if not isinstance(advertised, dict):
        return None
    modes = native_modes(initialize_result)
    custom = tuple(name for name in modes if name.startswith("_"))
    return Delivery(append=True, override="override" in modes, custom_modes=custom)


def agent_name(initialize_result: JsonObject) -> str | None:
    info = initialize_result.get("info" if is_v2(initialize_result) else "agentInfo")
    if isinstance(info, dict) and isinstance(info.get("name"), str):
        name: str = info["name"]
        return name
    return None


def advertise(
    initialize_result: JsonObject, delivery: Delivery | None, *, adapter: str
) -> JsonObject:
    """The initialize result the client sees, for the given (policy-adjusted) delivery."""
    v2 = is_v2(initialize_result)
    caps_key = "capabilities" if v2 else "agentCapabilities"
    session_key = "session" if v2 else "sessionCapabilities"
    caps: dict[str, Any] = dict(agent_capabilities(initialize_result))
    meta = caps.get("_meta")
    caps["_meta"] = {
        **(meta if isinstance(meta, dict) else {}),
        BRIDGE_META_KEY: {"version": __version__, "adapter": adapter},
    }
    session = caps.get(session_key)
    # In v2 a `session` object means "supports the session methods"; never invent it.
    if delivery is not None and (isinstance(session, dict) or not v2):
        session = dict(session) if isinstance(session, dict) else {}
        session["systemPrompt"] = advertised_capability(initialize_result, delivery)
        caps[session_key] = session
    elif isinstance(session, dict) and "systemPrompt" in session:
        # The bridge intercepts the field, so it must not promise what it cannot deliver.
        caps[session_key] = {k: v for k, v in session.items() if k != "systemPrompt"}
    return {**initialize_result, caps_key: caps}


def advertised_capability(initialize_result: JsonObject, delivery: Delivery) -> JsonObject:
    """The ``systemPrompt`` capability for ``delivery``: ``mode.override`` when it is
    delivered, and each custom mode passed on with the agent's own value for it."""
    modes: JsonObject = {"override": {}} if delivery.override else {}
    own = native_modes(initialize_result)
    modes.update({name: own.get(name, {}) for name in delivery.custom_modes})
    return {"mode": modes} if modes else {}


def initialize_answer(
    adapter: Advertiser, initialize_result: JsonObject, *, allow_override: bool
) -> tuple[Delivery | None, JsonObject | None]:
    """The delivery (after the ``allow_override`` policy) and the result the client gets
    for the agent's ``initialize`` result; ``None`` for the result: the agent's answer
    passes unchanged (nothing can be delivered, so nothing is advertised)."""
    delivery = adapter.delivery(initialize_result)
    if delivery is None:
        return None, None
    if not allow_override:
        delivery = delivery._replace(override=False)
    adjusted = adapter.adjust_capabilities(copy.deepcopy(initialize_result))
    return delivery, advertise(adjusted, delivery, adapter=adapter.name)
