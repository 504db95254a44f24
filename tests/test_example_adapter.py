"""The example adapter of docs/writing-adapters.md, loaded from its folder as a user would."""

from __future__ import annotations

from pathlib import Path

import trio
from test_runtime import bridge_over_memory, new_session

from acp_bridge.registry import AdapterRegistry

EXAMPLES = Path(__file__).parent.parent / "docs" / "examples" / "adapters"


def test_the_example_adapter_is_chosen_for_its_agent() -> None:
    registry = AdapterRegistry([EXAMPLES])
    chosen = registry.choose({"agentInfo": {"name": "acme-agent"}})
    assert chosen.name == "acme"


async def test_the_example_adapter_delivers_the_prompt_in_its_meta_key() -> None:
    with trio.fail_after(10):
        async with bridge_over_memory(adapter_folders=[EXAMPLES], agent_name="acme-agent") as (
            client,
            agent,
        ):
            await client.send(new_session(1))
            answer = await client.receive()
            assert answer["result"]["sessionId"] == "sess-1"
    (sent,) = [m for m in agent.received if m.get("method") == "session/new"]
    assert sent["params"]["_meta"] == {"acme.dev/instructions": "Be brief."}
    assert "systemPrompt" not in sent["params"]
