"""Which command lines start the agent before the bridge has loaded (acp_bridge.launch)."""

from __future__ import annotations

import pytest

from acp_bridge.launch import agent_command


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "npx", "-y", "agent"], ["npx", "-y", "agent"]),
        (["--state", ":memory:", "--", "agent", "--acp"], ["agent", "--acp"]),
        (["--state=:memory:", "--trace-prompts", "--", "agent"], ["agent"]),
        (["--config", "c.yaml", "--log-level", "debug", "--", "a"], ["a"]),
        # Left to the usual path: a preset, an adapter to check first, another command,
        # an option it does not know, no command at all.
        (["--agent", "claude"], None),
        (["--adapter", "codex", "--", "codex-acp"], None),
        (["verify", "--", "agent"], None),
        (["--unknown", "--", "agent"], None),
        (["agent"], None),
        (["--"], None),
    ],
)
def test_only_an_agent_command_with_neutral_options_starts_early(
    args: list[str], expected: list[str] | None
) -> None:
    assert agent_command(args) == expected
