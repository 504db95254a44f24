"""Finding and choosing adapters: built-ins from the installed package, a user's own folder,
automatic choice from the agent's ``initialize`` response, and ``--adapter``."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from harness import (
    NATIVE_OVERRIDE,
    TIMEOUT,
    FakeAgent,
    bridge_env,
    command_in_process,
    wire_prompt,
)

from acp_bridge import __version__, builtin_adapters, registry
from acp_bridge.adapter import Adapter
from acp_bridge.commands.cli import main
from acp_bridge.core.capabilities import native_delivery
from acp_bridge.registry import AdapterNotFound, AdapterRegistry

SHOUT_ADAPTER = textwrap.dedent(
    '''
    """A user adapter: hands the prompt to the agent in upper case, in _meta."""

    from acp_bridge.adapter import Adapter, Delivery, LifecycleCall, Reply
    from acp_bridge.wire.jsonrpc import JsonObject


    class ShoutAdapter(Adapter):
        name = "shout"

        @classmethod
        def detect(cls, initialize_result: JsonObject) -> bool:
            return initialize_result.get("agentInfo", {}).get("name") == "shouty-agent"

        def delivery(self, initialize_result: JsonObject) -> Delivery | None:
            return Delivery(append=True, override=True)

        async def session_new(self, call: LifecycleCall) -> Reply:
            if call.prompt is not None:
                call.params["_meta"] = {"shout": call.prompt.text.upper()}
            return await call.forward()
    '''
)


def v1_result(caps: dict[str, Any], name: str = "some-agent") -> dict[str, Any]:
    return {"protocolVersion": 1, "agentCapabilities": caps, "agentInfo": {"name": name}}


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "my-adapters"
    folder.mkdir()
    (folder / "shout.py").write_text(SHOUT_ADAPTER)
    return folder


def test_builtin_adapters_come_from_the_installed_package() -> None:
    registry = AdapterRegistry()
    assert {"native", "first-turn", "passthrough"} <= set(registry.names())
    for name in ("native", "first-turn", "passthrough"):
        adapter = registry.get(name)
        assert issubclass(adapter, Adapter)
        assert adapter.__module__.startswith("acp_bridge.adapters.")


def test_auto_choice_is_native_when_the_agent_advertises_system_prompt() -> None:
    registry = AdapterRegistry()
    assert registry.choose(v1_result(NATIVE_OVERRIDE)).name == "native"
    v2 = {"protocolVersion": 2, "capabilities": {"session": {"systemPrompt": {}}}}
    assert registry.choose(v2).name == "native"


def test_auto_choice_for_a_pinning_claude_agent_acp_is_claude_despite_native_support() -> None:
    # 0.101.0 advertises systemPrompt itself but pins a session's first prompt; only the
    # claude adapter's _meta form (snapshot: false) applies a changed one (spec section 7).
    initialize = v1_result(NATIVE_OVERRIDE, name="@agentclientprotocol/claude-agent-acp")
    initialize["agentInfo"]["version"] = "0.101.0"
    assert AdapterRegistry().choose(initialize).name == "claude"


def test_an_adapter_that_recognises_the_agent_beats_its_native_advertisement(
    user_folder: Path,
) -> None:
    registry = AdapterRegistry([user_folder])
    assert registry.choose(v1_result(NATIVE_OVERRIDE, name="shouty-agent")).name == "shout"
    assert registry.choose(v1_result(NATIVE_OVERRIDE, name="other-agent")).name == "native"


def test_auto_choice_falls_back_to_first_turn() -> None:
    registry = AdapterRegistry()
    assert registry.choose(v1_result({})).name == "first-turn"
    assert registry.choose({}).name == "first-turn"


def builtin_adapter_classes() -> list[type[Adapter]]:
    """Every built-in adapter, imported (the registry imports only those it uses)."""
    return [registry.builtin(name) for name in builtin_adapters.names()]


def declared_agent_names(adapter: type[Adapter]) -> set[str]:
    """The agent names an adapter's module declares (``AGENT_NAME``, ``AGENT_NAMES``) or
    its pool class reports (``reported_name``)."""
    module = sys.modules[adapter.__module__]
    found: set[str] = set()
    for value in (
        getattr(module, "AGENT_NAME", None),
        getattr(module, "AGENT_NAMES", None),
        getattr(adapter, "reported_name", None),
    ):
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, (set, frozenset)):
            found.update(value)
    return found


def initialize_results(name: str | None) -> list[dict[str, Any]]:
    """Version 1 and 2 answers of an agent called ``name``, with and without a native
    ``systemPrompt`` advertisement."""
    results: list[dict[str, Any]] = []
    for native in (False, True):
        session: dict[str, Any] = {"systemPrompt": {}} if native else {}
        v1: dict[str, Any] = {
            "protocolVersion": 1,
            "agentCapabilities": {"sessionCapabilities": session},
        }
        v2: dict[str, Any] = {"protocolVersion": 2, "capabilities": {"session": session}}
        if name is not None:
            v1["agentInfo"] = {"name": name, "version": "1.0.0"}
            v2["info"] = {"name": name, "version": "1.0.0"}
        results += [v1, v2]
    return results


def test_every_builtin_adapter_detects_exactly_its_names_in_the_table() -> None:
    adapters = builtin_adapter_classes()
    declared = {adapter.name: declared_agent_names(adapter) for adapter in adapters}
    for adapter in adapters:
        for agent in declared[adapter.name]:
            assert builtin_adapters.AGENTS.get(agent) == adapter.name, (adapter.name, agent)
    candidates = {*builtin_adapters.AGENTS, *(n for names in declared.values() for n in names)}
    names: list[str | None] = [*sorted(candidates), "some-agent", None]
    for adapter in adapters:
        for name in names:
            for result in initialize_results(name):
                if adapter.name == builtin_adapters.NATIVE:
                    expected = native_delivery(result) is not None
                else:
                    expected = builtin_adapters.AGENTS.get(
                        name or ""
                    ) == adapter.name and builtin_adapters.recognised(
                        name or "", native_delivery(result) is not None
                    )
                assert adapter.detect(result) == expected, (adapter.name, name, result)


def test_the_table_chooses_what_the_adapters_detect_chose() -> None:
    """The rule the table replaced: the first adapter by name whose ``detect`` accepts the
    agent, then ``native`` for an agent that advertises the field, then ``first-turn``."""
    adapters = sorted(builtin_adapter_classes(), key=lambda adapter: adapter.name)
    names: list[str | None] = [*sorted(builtin_adapters.AGENTS), "some-agent", None]
    for result in [result for name in names for result in initialize_results(name)]:
        detected = [
            adapter.name
            for adapter in adapters
            if adapter.name not in ("native", "first-turn") and adapter.detect(result)
        ]
        fallback = "native" if native_delivery(result) is not None else "first-turn"
        assert AdapterRegistry().choose(result).name == (detected or [fallback])[0], result


def test_the_table_names_only_builtin_adapters() -> None:
    assert set(builtin_adapters.AGENTS.values()) <= set(builtin_adapters.names())


def test_unknown_adapter_names_the_known_ones() -> None:
    with pytest.raises(AdapterNotFound, match="first-turn"):
        AdapterRegistry().get("no-such-adapter")


def test_missing_user_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AdapterNotFound, match="does not exist"):
        AdapterRegistry([tmp_path / "nowhere"])


def test_user_folder_adds_an_adapter_found_by_name(user_folder: Path) -> None:
    registry = AdapterRegistry([user_folder])
    assert "shout" in registry.names()
    assert "first-turn" in registry.names()
    assert registry.choose(v1_result({}, name="shouty-agent")).name == "shout"
    assert registry.choose(v1_result({})).name == "first-turn"


def test_user_adapter_replaces_a_builtin_of_the_same_name(user_folder: Path) -> None:
    (user_folder / "mine.py").write_text(
        "from acp_bridge.adapter import Adapter\n\n\n"
        "class MyFirstTurn(Adapter):\n"
        '    name = "first-turn"\n'
    )
    registry = AdapterRegistry([user_folder])
    assert registry.get("first-turn").__name__ == "MyFirstTurn"


def write_config(tmp_path: Path, folder: Path) -> Path:
    config = tmp_path / "bridge.yaml"
    config.write_text(f"bridge:\n  adapter_paths: [{str(folder)!r}]\n")
    return config


async def test_config_adapter_paths_with_adapter_option_uses_the_user_adapter(
    tmp_path: Path, user_folder: Path
) -> None:
    config = write_config(tmp_path, user_folder)
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with command_in_process(agent, config=config, adapter="shout", home=tmp_path) as peer:
            result = await peer.initialize()
            await peer.new(wire_prompt("be loud", mode="override"))
            await peer.sync()
    caps = result["agentCapabilities"]
    assert caps["_meta"]["acp-bridge"] == {"version": __version__, "adapter": "shout"}
    assert caps["sessionCapabilities"]["systemPrompt"] == {"mode": {"override": {}}}
    new = agent.params_of("session/new")[0]
    assert new["_meta"] == {"shout": "BE LOUD"}
    assert "systemPrompt" not in new


async def test_config_adapter_paths_take_part_in_auto_choice(
    tmp_path: Path, user_folder: Path
) -> None:
    config = write_config(tmp_path, user_folder)
    agent = FakeAgent(tmp_path / "agent.jsonl", name="shouty-agent")
    with trio.fail_after(TIMEOUT):
        async with command_in_process(agent, config=config, home=tmp_path) as peer:
            result = await peer.initialize()
    assert result["agentCapabilities"]["_meta"]["acp-bridge"]["adapter"] == "shout"


async def test_adapter_option_beats_auto_choice_in_the_command(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    with trio.fail_after(TIMEOUT):
        async with command_in_process(agent, adapter="first-turn", home=tmp_path) as peer:
            result = await peer.initialize()
    caps = result["agentCapabilities"]
    assert caps["_meta"]["acp-bridge"]["adapter"] == "first-turn"
    assert caps["sessionCapabilities"]["systemPrompt"] == {}


def test_unknown_adapter_option_fails_before_starting_the_agent(tmp_path: Path) -> None:
    """Through the command line in this process (click's runner): a name that is not a
    built-in adapter is not started early (launch.py), and is refused before the run
    command starts anything."""
    agent = FakeAgent(tmp_path / "agent.jsonl")
    args = ["--adapter", "no-such-adapter", "--state", ":memory:", "--", *agent.argv()]
    env: dict[str, str | None] = dict(bridge_env(tmp_path))
    done = CliRunner().invoke(main, args, input=b"", env=env, prog_name="acp-bridge")
    assert done.exit_code != 0
    assert b"no-such-adapter" in done.stderr_bytes
    assert b"first-turn" in done.stderr_bytes  # the message lists the adapters there are
    assert done.stdout_bytes == b""  # nothing but ACP ever goes to stdout
    assert not agent.record.exists()
