"""Validation of the client's systemPrompt (spec §5): the bridge answers, the agent never sees it.

Every row of the table is sent on ``session/new``, ``session/load``, ``session/resume`` and
``session/fork`` through a real bridge in front of the fake agent. Each answer must be
``-32602`` with a one-sentence message and ``data.field`` naming the offending field, every
error frame must be valid under the official schema (checked by :class:`harness.Peer`), and
the agent's record must show none of those requests.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import pytest
import trio
import trio.testing
from harness import (
    AGENT_NAME,
    NATIVE_OVERRIDE,
    TIMEOUT,
    FakeAgent,
    Peer,
    bridge_in_process,
    command_in_process,
    in_process_peer,
    joined,
    lifecycle_params,
    wire_prompt,
)

from acp_bridge.core.system_prompt import (
    DEFAULT_MAX_PROMPT_BYTES,
    MAX_PROMPT_BLOCKS,
    PromptRejected,
    SystemPrompt,
    parse_system_prompt,
)
from acp_bridge.state.store import SessionStore

INVALID_PARAMS: Final = -32602
METHODS: Final = ("session/new", "session/load", "session/resume", "session/fork")
# One sentence: starts with a capital, ends with a full stop, no sentence break inside.
ONE_SENTENCE: Final = re.compile(r"[A-Z][^\n]*[.]")
SENTENCE_BREAK: Final = re.compile(r"[.!?]\s")

TEXT = {"type": "text", "text": "Be brief."}

# (case id, systemPrompt value, field path named in data.field)
REJECTED: Final[list[tuple[str, Any, str]]] = [
    ("not_an_object_string", "Be brief.", "systemPrompt"),
    ("not_an_object_array", [TEXT], "systemPrompt"),
    ("not_an_object_number", 7, "systemPrompt"),
    ("not_an_object_boolean", False, "systemPrompt"),
    ("mode_missing", {"content": [TEXT]}, "systemPrompt.mode"),
    ("mode_not_a_string", {"mode": 1, "content": [TEXT]}, "systemPrompt.mode"),
    ("mode_null", {"mode": None, "content": [TEXT]}, "systemPrompt.mode"),
    ("mode_custom", {"mode": "_custom", "content": [TEXT]}, "systemPrompt.mode"),
    ("mode_replace", {"mode": "replace", "content": [TEXT]}, "systemPrompt.mode"),
    ("override_not_advertised", {"mode": "override", "content": [TEXT]}, "systemPrompt.mode"),
    ("content_missing", {"mode": "append"}, "systemPrompt.content"),
    ("content_not_an_array", {"mode": "append", "content": TEXT}, "systemPrompt.content"),
    ("content_a_string", {"mode": "append", "content": "Be brief."}, "systemPrompt.content"),
    ("content_empty", {"mode": "append", "content": []}, "systemPrompt.content"),
    (
        "image_block",
        {
            "mode": "append",
            "content": [TEXT, TEXT, {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
        },
        "systemPrompt.content[2].type",
    ),
    (
        "audio_block",
        {"mode": "append", "content": [{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}]},
        "systemPrompt.content[0].type",
    ),
    (
        "resource_block",
        {
            "mode": "append",
            "content": [
                TEXT,
                {"type": "resource", "resource": {"uri": "file:///a.md", "text": "Be brief."}},
            ],
        },
        "systemPrompt.content[1].type",
    ),
    (
        "resource_link_block",
        {
            "mode": "append",
            "content": [{"type": "resource_link", "uri": "file:///a.md", "name": "a.md"}],
        },
        "systemPrompt.content[0].type",
    ),
    (
        "unknown_block_type",
        {"mode": "append", "content": [{"type": "markdown", "text": "# Be brief."}]},
        "systemPrompt.content[0].type",
    ),
    (
        "block_without_type",
        {"mode": "append", "content": [{"text": "Be brief."}]},
        "systemPrompt.content[0].type",
    ),
    (
        "block_not_an_object",
        {"mode": "append", "content": ["Be brief."]},
        "systemPrompt.content[0]",
    ),
    (
        "text_block_without_text",
        {"mode": "append", "content": [TEXT, {"type": "text"}]},
        "systemPrompt.content[1].text",
    ),
    (
        "text_block_with_non_string_text",
        {"mode": "append", "content": [{"type": "text", "text": ["Be", "brief."]}]},
        "systemPrompt.content[0].text",
    ),
    (
        "text_block_with_null_text",
        {"mode": "append", "content": [{"type": "text", "text": None}]},
        "systemPrompt.content[0].text",
    ),
    (
        "text_over_default_limit_across_blocks",
        wire_prompt(
            "a" * (DEFAULT_MAX_PROMPT_BYTES // 2), "b" * (DEFAULT_MAX_PROMPT_BYTES // 2 + 1)
        ),
        "systemPrompt.content",
    ),
]


def assert_one_sentence(message: object) -> None:
    assert isinstance(message, str)
    assert ONE_SENTENCE.fullmatch(message), message
    assert not SENTENCE_BREAK.search(message), message


def assert_rejected(error: dict[str, Any], field: str) -> None:
    assert error["code"] == INVALID_PARAMS, error
    assert error["data"] == {"field": field}, error
    assert_one_sentence(error["message"])


async def assert_agent_saw_no_lifecycle_request(peer: Peer, agent: FakeAgent) -> None:
    await peer.sync()  # everything forwarded before this is in the record now
    assert not set(agent.methods()) & set(METHODS), agent.methods()


async def reject_on_every_method(peer: Peer, value: Any, field: str) -> None:
    for method in METHODS:
        params = lifecycle_params(method, "sess-9", None)
        params["systemPrompt"] = value
        error = await peer.error(method, params)
        assert_rejected(error, field)


@pytest.mark.parametrize(
    ("value", "field"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED]
)
async def test_invalid_prompt_rejected_without_reaching_agent(
    tmp_path: Path, value: Any, field: str
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            await reject_on_every_method(peer, value, field)
            await assert_agent_saw_no_lifecycle_request(peer, agent)
        assert store.list() == []


@pytest.mark.parametrize("version", [1, 2])
async def test_rejection_frames_are_valid_for_both_protocol_versions(
    tmp_path: Path, version: int
) -> None:
    caps: dict[str, Any] = {"session": {}} if version == 2 else {}
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=caps)
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent, version=version) as peer:
            for _, value, field in REJECTED:
                error = await peer.error(
                    "session/new", lifecycle_params("session/new", None, value)
                )
                assert_rejected(error, field)
            await assert_agent_saw_no_lifecycle_request(peer, agent)
        # Peer validated each frame against the v1 or v2 schema as it arrived.
        assert len(peer.responses) == len(REJECTED) + 1


async def assert_override_not_offered_and_refused(peer: Peer, agent: FakeAgent) -> None:
    """The bridge hides the agent's override and rejects it before the agent sees a request."""
    result = await peer.initialize()
    advertised = result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]
    assert advertised == {}
    await reject_on_every_method(
        peer, wire_prompt("Be brief.", mode="override"), "systemPrompt.mode"
    )
    await assert_agent_saw_no_lifecycle_request(peer, agent)


async def test_override_rejected_when_policy_forbids_it_on_an_agent_that_could(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, allow_override=False) as peer:
            await assert_override_not_offered_and_refused(peer, agent)


async def test_override_rejected_with_no_override_flag(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    with trio.fail_after(TIMEOUT):
        async with command_in_process(agent, no_override=True, home=tmp_path) as peer:
            await assert_override_not_offered_and_refused(peer, agent)


async def test_override_accepted_when_advertised(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    prompt = wire_prompt("You are a pirate.", mode="override")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            await peer.new(prompt)
            await peer.sync()
    assert agent.params_of("session/new")[0]["systemPrompt"] == prompt


async def test_prompt_limit_is_configurable(tmp_path: Path) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("bridge:\n  max_prompt_bytes: 10\n")
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with command_in_process(agent, config=config, home=tmp_path) as peer:
            await peer.initialize()
            # Ten bytes are fine, eleven are not; "é" counts as the two bytes it takes, and
            # the blank line that joins two blocks as the two it adds to what is delivered.
            await peer.new(wire_prompt("1234", "5678"))
            await reject_on_every_method(peer, wire_prompt("1234", "567é"), "systemPrompt.content")
            await peer.sync()
    assert len(agent.params_of("session/new")) == 1


async def test_prompt_exactly_at_default_limit_is_accepted(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    text = "x" * DEFAULT_MAX_PROMPT_BYTES
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            session_id = await peer.new(wire_prompt(text))
            await peer.prompt(session_id)
    assert agent.prompts(session_id)[0][0] == {"type": "text", "text": text}


@pytest.mark.parametrize("method", METHODS)
async def test_null_prompt_is_the_same_as_omitted(tmp_path: Path, method: str) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store, on_omitted="default") as peer:
            await peer.initialize()
            params = lifecycle_params(method, "sess-7", None)
            omitted = dict(params)
            params["systemPrompt"] = None
            result = await peer.ok(method, params)
            await peer.sync()
            record = store.get(AGENT_NAME, result.get("sessionId", "sess-7"))
            assert record is not None and record.prompt is None
    # The bridge removes the field either way: the agent sees the request as if omitted.
    assert agent.params_of(method) == [omitted]


async def test_valid_text_is_delivered_verbatim(tmp_path: Path) -> None:
    blocks = (
        "  Leading spaces stay.",
        "Trailing blank lines stay.\n\n",
        "{{ not_a_template }} ${HOME} {% raw %} <b>&amp;</b> \\n",
        "",
        "Ünïcödé and emoji 🦜\r\nand CRLF.",
    )
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            session_id = await peer.new(wire_prompt(*blocks))
            await peer.prompt(session_id, "question")
            record = store.get(AGENT_NAME, session_id)
    first = agent.prompts(session_id)[0]
    assert first == [
        {"type": "text", "text": joined(*blocks)},
        {"type": "text", "text": "question"},
    ]
    assert record is not None and record.prompt is not None
    assert record.prompt.text == joined(*blocks)


async def test_native_agent_receives_the_client_object_untouched(tmp_path: Path) -> None:
    prompt = {
        "mode": "append",
        "content": [
            {"type": "text", "text": " a ", "annotations": {"priority": 1}},
            {"type": "text", "text": "b\n"},
        ],
        "_meta": {"vendor.example/tag": [1, 2]},
    }
    agent = FakeAgent(tmp_path / "agent.jsonl", caps=NATIVE_OVERRIDE)
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            await peer.new(prompt)
            await peer.sync()
    assert agent.params_of("session/new")[0]["systemPrompt"] == prompt


# --- the same table, sans-IO -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED]
)
def test_parse_rejects_each_row_of_the_table(value: Any, field: str) -> None:
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt(value, override_allowed=False)
    error = caught.value.error()
    assert error["code"] == INVALID_PARAMS
    assert error["data"] == {"field": field}
    assert_one_sentence(error["message"])


def test_parse_treats_null_as_omitted() -> None:
    assert parse_system_prompt(None, override_allowed=True) is None


def test_parse_rejects_a_meta_that_is_not_an_object() -> None:
    value = {**wire_prompt("a"), "_meta": "x"}
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt(value, override_allowed=True)
    assert caught.value.field == "systemPrompt._meta"


def test_parse_keeps_blocks_in_order_and_joins_them_with_a_blank_line() -> None:
    parsed = parse_system_prompt(wire_prompt(" one ", "two\n", "three"), override_allowed=False)
    assert parsed == SystemPrompt.of_text("append", " one ", "two\n", "three")
    assert parsed.text == " one \n\ntwo\n\n\nthree"


def test_parse_counts_the_blank_lines_that_join_blocks() -> None:
    # 131,072 + 131,071 bytes of text fit 256 KiB, but what is delivered has two more.
    halves = ("x" * (DEFAULT_MAX_PROMPT_BYTES // 2), "x" * (DEFAULT_MAX_PROMPT_BYTES // 2 - 1))
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt(wire_prompt(*halves), override_allowed=False)
    assert caught.value.field == "systemPrompt.content"
    assert str(DEFAULT_MAX_PROMPT_BYTES + 1) in caught.value.message
    fits = ("x" * (DEFAULT_MAX_PROMPT_BYTES // 2 - 1),) * 2
    parsed = parse_system_prompt(wire_prompt(*fits), override_allowed=False)
    assert parsed is not None and len(parsed.text) == DEFAULT_MAX_PROMPT_BYTES


def test_parse_bounds_the_number_of_blocks() -> None:
    # A million empty blocks are 2 MB of blank lines once joined, and a model object each.
    flood = wire_prompt(*[""] * 1_000_000, "x")
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt(flood, override_allowed=False)
    assert caught.value.field == "systemPrompt.content"
    assert_one_sentence(caught.value.message)
    assert f"at most {MAX_PROMPT_BLOCKS} blocks" in caught.value.message
    most = parse_system_prompt(wire_prompt(*["a"] * MAX_PROMPT_BLOCKS), override_allowed=False)
    assert most is not None and len(most.content) == MAX_PROMPT_BLOCKS


async def test_too_many_blocks_are_rejected_through_the_bridge(tmp_path: Path) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            await peer.initialize()
            flood = wire_prompt(*[""] * MAX_PROMPT_BLOCKS, "x")
            await reject_on_every_method(peer, flood, "systemPrompt.content")
            await assert_agent_saw_no_lifecycle_request(peer, agent)
        assert store.list() == []


def test_parse_counts_bytes_not_characters() -> None:
    assert parse_system_prompt(wire_prompt("é" * 5), override_allowed=False, max_bytes=10)
    with pytest.raises(PromptRejected):
        parse_system_prompt(wire_prompt("é" * 5, "x"), override_allowed=False, max_bytes=10)


async def test_lifecycle_request_sent_before_initialize_answer_is_still_validated(
    tmp_path: Path,
) -> None:
    # A client may pipeline session/new right behind initialize; the bridge must not let it
    # through unvalidated while it is still choosing the adapter.
    agent = FakeAgent(tmp_path / "agent.jsonl")
    invalid = {"mode": "_custom", "content": [TEXT]}
    with trio.fail_after(TIMEOUT), SessionStore(":memory:") as store:
        async with bridge_in_process(agent, store) as peer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(peer.initialize)
                await trio.testing.wait_all_tasks_blocked()
                error = await peer.error(
                    "session/new", lifecycle_params("session/new", None, invalid)
                )
            assert_rejected(error, "systemPrompt.mode")
            await assert_agent_saw_no_lifecycle_request(peer, agent)


# --- keys beyond mode, content and _meta follow the schema ------------------------------


@pytest.mark.parametrize("meta", ["x", 7, None, {"a": 1}, [1]])
def test_a_key_named_meta_is_an_unknown_key_kept_as_it_came(meta: Any) -> None:
    value = {**wire_prompt("a"), "meta": meta}
    parsed = parse_system_prompt(value, override_allowed=False)
    assert parsed is not None
    assert parsed.to_wire() == {**wire_prompt("a"), "meta": meta}
    assert "_meta" not in parsed.to_wire()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({**wire_prompt("a"), "_meta": [1]}, "systemPrompt._meta"),
        (
            {"mode": "append", "content": [{"type": "text", "text": "a", "_meta": "x"}]},
            "systemPrompt.content[0]._meta",
        ),
        (
            {"mode": "append", "content": [{"type": "text", "text": "a", "annotations": 3}]},
            "systemPrompt.content[0].annotations",
        ),
    ],
)
def test_known_optional_keys_of_the_wrong_type_are_rejected_naming_them(
    value: Any, field: str
) -> None:
    with pytest.raises(PromptRejected) as caught:
        parse_system_prompt(value, override_allowed=False)
    assert caught.value.field == field
    assert_one_sentence(caught.value.error()["message"])


def test_unknown_keys_of_prompt_and_blocks_are_kept() -> None:
    value = {
        "mode": "append",
        "content": [{"type": "text", "text": "a", "future": {"x": 1}, "_meta": None}],
        "future": [1, 2],
        "_meta": None,
    }
    parsed = parse_system_prompt(value, override_allowed=False)
    assert parsed is not None
    wire = parsed.to_wire()
    assert wire["future"] == [1, 2]
    assert wire["content"][0]["future"] == {"x": 1}


async def test_prompt_with_a_meta_key_through_the_bridge_is_not_an_internal_error(
    tmp_path: Path,
) -> None:
    agent = FakeAgent(tmp_path / "agent.jsonl")
    with trio.fail_after(TIMEOUT):
        async with in_process_peer(agent) as peer:
            session_id = await peer.new({**wire_prompt("a"), "meta": "not-an-object"})
            await peer.prompt(session_id)
            error = await peer.error(
                "session/new",
                lifecycle_params("session/new", None, {**wire_prompt("a"), "_meta": 5}),
            )
            assert_rejected(error, "systemPrompt._meta")
