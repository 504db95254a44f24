"""The built-in adapters by name, and which one fits an agent, without importing any of them:
standard library only.

Each built-in adapter lives in the module named after it, ``-`` spelt ``_`` (``first-turn``
in ``adapters/first_turn.py``, installed as ``acp_bridge.adapters.first_turn``; a test holds
every built-in adapter to this). So a name given on the command line can be checked, and
its adapter loaded alone, before trio, pydantic and the other adapters are imported
(:mod:`acp_bridge.commands.launch`, :mod:`acp_bridge.runtime.early_initialize`,
:mod:`acp_bridge.registry`).

The automatic choice (spec section 7: the adapter that passes ``verify`` for the agent at
hand) is decided here, from the agent's ``initialize`` answer, by :func:`choose`:

1. the adapter :data:`AGENTS` names for the agent's name (``agentInfo.name``, in version 2
   ``info.name``): an adapter that recognises an agent knows its quirks, and a native
   advertisement alone does not prove the agent applies a changed prompt
   (``@agentclientprotocol/claude-agent-acp`` 0.92 and later advertise ``systemPrompt``
   but pin a session's first one, so ``claude`` wins over ``native`` for them);
2. ``native`` when the agent advertises ``systemPrompt`` itself;
3. ``first-turn``.

A user's own adapters (``bridge.adapter_paths``) that recognise the agent come before all
three (:meth:`acp_bridge.registry.AdapterRegistry.choose`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # no ``typing`` at run time: see acp_bridge.commands.launch
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Final

PACKAGE: Final = "acp_bridge.adapters"
AUTO: Final = "auto"
NATIVE: Final = "native"
FALLBACK: Final = "first-turn"

# The name an agent gives itself in its initialize answer -> the built-in adapter for it.
# One line per name, exactly as the agent spells it (npm package names for most). The
# adapter's own ``detect`` accepts exactly its names here: tests/test_adapters_registry.py
# holds every built-in adapter to this table.
AGENTS: Final[dict[str, str]] = {
    "@agentclientprotocol/claude-agent-acp": "claude",
    "@zed-industries/claude-agent-acp": "claude",
    "@zed-industries/claude-code-acp": "claude",
    "@agentclientprotocol/codex-acp": "codex",
    "cline": "cline",
    "codex-acp": "codex",
    "Copilot": "copilot",
    "gemini-cli": "gemini",
    "goose": "goose",
    "Kilo": "kilo",
    "OpenCode": "opencode",
    "qwen-code": "qwen",
}


# Names recognised only when the agent also advertises systemPrompt itself: their adapter
# builds on that native half (codex-acp 2.3 and later: append), and earlier releases
# without it fall through to the rules below.
NEEDS_NATIVE: Final = frozenset({"@agentclientprotocol/codex-acp"})


def choose(agent_name: str | None, advertises_system_prompt: bool) -> str:
    """The built-in adapter for an agent, by the rules above.

    ``agent_name``: the name in its initialize answer, if any;
    ``advertises_system_prompt``: whether it advertises ``systemPrompt`` itself
    (:func:`acp_bridge.core.capabilities.native_delivery` is not None).
    """
    if agent_name is not None and recognised(agent_name, advertises_system_prompt):
        return AGENTS[agent_name]
    return NATIVE if advertises_system_prompt else FALLBACK


def recognised(agent_name: str, advertises_system_prompt: bool) -> bool:
    """Whether :data:`AGENTS` names an adapter for this agent (see :data:`NEEDS_NATIVE`)."""
    if agent_name not in AGENTS:
        return False
    return advertises_system_prompt or agent_name not in NEEDS_NATIVE


def _folders() -> Iterator[str]:
    import importlib.util  # only when a name is looked up (not for the default path)

    spec = importlib.util.find_spec(PACKAGE)
    yield from (spec.submodule_search_locations or []) if spec is not None else []


def module_of(name: str) -> str | None:
    """The module of the built-in adapter ``name``, or None if there is no such module."""
    module = name.replace("-", "_")
    if not module.isidentifier():
        return None
    for folder in _folders():
        if os.path.isfile(os.path.join(folder, module + ".py")):
            return f"{PACKAGE}.{module}"
    return None


def names() -> list[str]:
    """Every built-in adapter's name (from the module names: nothing is imported)."""
    found = {
        entry[: -len(".py")].replace("_", "-")
        for folder in _folders()
        for entry in os.listdir(folder)
        if entry.endswith(".py") and not entry.startswith("_")
    }
    return sorted(found)
