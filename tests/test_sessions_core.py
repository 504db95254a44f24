"""The session table's rules (``acp_bridge.core.sessions``), in memory: no agent, no store.

Each test feeds the table what the runtime would (a request, what the store holds, the
agent's answer) and looks at the values it returns: what a request runs with, what must be
stored, what must be sent to the agent. One test per rule of spec §4-§6; the section
"Lifecycle rules and their tests" of docs/architecture.md names, for each rule, these and
the in-memory runtime tests that prove it.
"""

from __future__ import annotations

import ast
import copy
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from acp_bridge.adapter import HOOKS, Adapter, AdapterContext, Delivery
from acp_bridge.core import capabilities, sessions, system_prompt
from acp_bridge.core.sessions import (
    INITIALIZE,
    OPENING,
    SESSION_METHODS,
    Forget,
    MarkClosed,
    Outcome,
    SaveSession,
    SessionTable,
    SetDelivered,
    Step,
    Withdraw,
    intercepted_methods,
    withdraw_methods,
)
from acp_bridge.core.system_prompt import PromptRejected, SystemPrompt
from acp_bridge.wire.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonObject

APPEND = SystemPrompt.of_text("append", "Be brief.")
OTHER = SystemPrompt.of_text("append", "Answer in French.")
OVERRIDE = SystemPrompt.of_text("override", "You are a pirate.")


@dataclass(frozen=True)
class Stored:
    """A stored session as the store's ``SessionRecord`` gives it."""

    prompt: SystemPrompt | None
    delivered: str | None = None


def v1_result(name: str | None = "agent-x", **session_caps: Any) -> JsonObject:
    result: JsonObject = {
        "protocolVersion": 1,
        "agentCapabilities": {"loadSession": True, "sessionCapabilities": session_caps},
    }
    if name is not None:
        result["agentInfo"] = {"name": name, "version": "1.0"}
    return result


def v2_result(name: str | None = "agent-x", session: Any = None) -> JsonObject:
    caps: JsonObject = {} if session is None else {"session": session}
    result: JsonObject = {"protocolVersion": 2, "capabilities": caps}
    if name is not None:
        result["info"] = {"name": name, "version": "1.0"}
    return result


def table(
    delivery: Delivery | None = None, *, on_omitted: Any = "keep", **options: Any
) -> SessionTable:
    """A table past ``initialize``, with an append-only adapter unless told otherwise."""
    sessions_table = SessionTable("agent-cmd", on_omitted=on_omitted, **options)
    sessions_table.initialized(
        v1_result(), delivery if delivery is not None else Delivery(), intercepts_prompt=False
    )
    return sessions_table


def new_params(prompt: Any = None, **extra: Any) -> JsonObject:
    params: JsonObject = {"cwd": "/", "mcpServers": [], **extra}
    if prompt is not None:
        params["systemPrompt"] = prompt.to_wire() if isinstance(prompt, SystemPrompt) else prompt
    return params


def session_params(session_id: str, prompt: Any = None, **extra: Any) -> JsonObject:
    return new_params(prompt, sessionId=session_id, **extra)


# ------------------------------------------------------------- §4 interception


def test_before_initialize_only_initialize_is_intercepted() -> None:
    assert SessionTable("agent-cmd").intercepted == {INITIALIZE}


def test_an_adapter_that_delivers_gets_the_six_session_methods() -> None:
    methods = SessionTable("agent-cmd").initialized(
        v1_result(), Delivery(), intercepts_prompt=False
    )
    assert methods == {
        "initialize", "session/new", "session/load", "session/resume", "session/fork",
        "session/close", "session/delete",
    }  # fmt: skip


def test_session_prompt_is_intercepted_only_when_the_adapter_asks() -> None:
    assert "session/prompt" in intercepted_methods(Delivery(), intercepts_prompt=True)
    assert "session/prompt" not in intercepted_methods(Delivery(), intercepts_prompt=False)


def test_in_version_2_session_load_is_not_intercepted() -> None:
    methods = SessionTable("agent-cmd").initialized(
        v2_result(session={}), Delivery(), intercepts_prompt=False
    )
    assert "session/load" not in methods
    assert {"session/new", "session/resume", "session/fork"} <= methods


def test_an_adapter_that_cannot_deliver_has_nothing_intercepted() -> None:
    sessions_table = SessionTable("agent-cmd")
    methods = sessions_table.initialized(v1_result(), None, intercepts_prompt=True)
    assert methods == {"initialize"}
    assert sessions_table.delivery is None


def test_every_intercepted_session_method_has_an_adapter_hook() -> None:
    assert set(HOOKS) == SESSION_METHODS | {"session/prompt"}


class _Append(Adapter):
    name = "test-append"


class _Override(Adapter):
    name = "test-override"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return Delivery(append=True, override=True)


class _Passthrough(Adapter):
    name = "test-passthrough"

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        return None


class _Context:
    """The little an adapter asks for while it is asked what it delivers."""

    log = logging.getLogger("test")


def _adapter(cls: type[Adapter]) -> Adapter:
    context: AdapterContext = _Context()  # type: ignore[assignment]
    return cls(context)


def test_v1_advertises_system_prompt_under_session_capabilities_and_keeps_every_key() -> None:
    agent = v1_result(list={}, close={})
    agent["agentCapabilities"]["_meta"] = {"vendor": 1}
    agent["authMethods"] = []
    before = copy.deepcopy(agent)
    delivery, answer = capabilities.initialize_answer(_adapter(_Append), agent, allow_override=True)
    assert delivery == Delivery() and answer is not None
    caps = answer["agentCapabilities"]
    assert caps["sessionCapabilities"] == {"list": {}, "close": {}, "systemPrompt": {}}
    assert caps["loadSession"] is True and answer["authMethods"] == []
    assert caps["_meta"]["vendor"] == 1
    assert caps["_meta"]["acp-bridge"]["adapter"] == "test-append"
    assert agent == before  # the agent's own answer is not edited in place


def test_v2_advertises_system_prompt_under_capabilities_session() -> None:
    _, answer = capabilities.initialize_answer(
        _adapter(_Override), v2_result(session={"delete": {}}), allow_override=True
    )
    assert answer is not None
    assert answer["capabilities"]["session"] == {
        "delete": {},
        "systemPrompt": {"mode": {"override": {}}},
    }
    assert "agentCapabilities" not in answer


def test_v2_without_session_methods_gets_no_session_object_invented() -> None:
    _, answer = capabilities.initialize_answer(
        _adapter(_Append), v2_result(session=None), allow_override=True
    )
    assert answer is not None and "session" not in answer["capabilities"]


def test_override_is_advertised_only_when_the_adapter_can_and_policy_allows() -> None:
    _, append_only = capabilities.initialize_answer(
        _adapter(_Append), v1_result(), allow_override=True
    )
    narrowed, no_override = capabilities.initialize_answer(
        _adapter(_Override), v1_result(), allow_override=False
    )
    _, both = capabilities.initialize_answer(_adapter(_Override), v1_result(), allow_override=True)
    assert append_only is not None and no_override is not None and both is not None
    assert append_only["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
    assert no_override["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {}
    assert narrowed == Delivery(append=True, override=False)
    assert both["agentCapabilities"]["sessionCapabilities"]["systemPrompt"] == {
        "mode": {"override": {}}
    }


def test_an_adapter_that_cannot_deliver_advertises_nothing() -> None:
    delivery, answer = capabilities.initialize_answer(
        _adapter(_Passthrough), v1_result(systemPrompt={}), allow_override=True
    )
    assert delivery is None and answer is None  # the agent's answer passes unchanged


# --------------------------------------------------------------- whose sessions


def test_sessions_are_stored_under_the_agents_own_name() -> None:
    sessions_table = SessionTable("npx")
    sessions_table.initialized(v1_result("claude-agent-acp"), Delivery(), intercepts_prompt=False)
    assert sessions_table.agent == "claude-agent-acp"


def test_sessions_are_stored_under_the_agents_own_name_in_version_2() -> None:
    sessions_table = SessionTable("goose")
    sessions_table.initialized(v2_result("goose-v2", {}), Delivery(), intercepts_prompt=False)
    assert sessions_table.agent == "goose-v2"


def test_an_agent_without_a_name_is_stored_under_its_command() -> None:
    sessions_table = SessionTable("codex-acp")
    sessions_table.initialized(v1_result(None), Delivery(), intercepts_prompt=False)
    assert sessions_table.agent == "codex-acp"


# ------------------------------------------------------- §5 what a request runs with


def test_a_request_naming_a_session_reads_it_first_and_new_reads_nothing() -> None:
    assert SessionTable.reads("session/new", new_params(sessionId="x")) is None
    assert SessionTable.reads("initialize", {"sessionId": "x"}) is None
    for method in ("session/load", "session/resume", "session/fork", "session/close",
                   "session/delete", "session/prompt"):  # fmt: skip
        assert SessionTable.reads(method, session_params("s1")) == "s1"
    assert SessionTable.reads("session/load", {"sessionId": 7}) is None


def test_the_prompt_is_taken_out_of_the_params_and_the_clients_params_are_left_alone() -> None:
    params = new_params(APPEND)
    step = table().begin("session/new", params, None)
    assert step.prompt == APPEND and step.client_sent_prompt
    assert step.params == {"cwd": "/", "mcpServers": []}
    assert "systemPrompt" in params


@pytest.mark.parametrize("method", sorted(OPENING))
def test_the_prompt_is_the_only_param_the_bridge_changes(method: str) -> None:
    # Spec §6: tools, MCP servers, permissions, modes and config options stay the client's.
    server = {"name": "fs", "command": "mcp-fs", "args": ["--root", "/"], "env": []}
    params = session_params(
        "s1",
        APPEND,
        mcpServers=[server],
        additionalDirectories=["/src"],
        modeId="plan",
        configOptions={"model": "small"},
        _meta={"claudeCode": {"options": {"allowedTools": ["Read"]}}, "trace": "t"},
    )
    step = table().begin(method, copy.deepcopy(params), Stored(OTHER))
    assert step.params == {key: value for key, value in params.items() if key != "systemPrompt"}


def test_no_method_that_changes_tools_modes_or_config_options_is_intercepted() -> None:
    steering = {"session/set_mode", "session/set_model", "session/set_config_option",
                "session/request_permission", "session/list", "authenticate"}  # fmt: skip
    for delivery in (None, Delivery(), Delivery(override=True, custom_modes=("_x",))):
        for intercepts_prompt in (False, True):
            for version_2 in (False, True):
                methods = intercepted_methods(
                    delivery, intercepts_prompt=intercepts_prompt, version_2=version_2
                )
                assert methods <= SESSION_METHODS | {INITIALIZE, "session/prompt"}
                assert not methods & steering


@pytest.mark.parametrize("method", sorted(OPENING))
def test_a_rejected_prompt_stops_the_request_naming_the_field(method: str) -> None:
    bad = {"mode": "append", "content": [{"type": "image", "data": "", "mimeType": "x"}]}
    with pytest.raises(PromptRejected) as rejected:
        table().begin(method, session_params("s1", bad), Stored(APPEND))
    error = rejected.value.error()
    assert error["code"] == INVALID_PARAMS
    assert error["data"] == {"field": "systemPrompt.content[0].type"}


def test_a_prompt_in_meta_is_rejected_naming_the_meta_field() -> None:
    params = new_params(_meta={"systemPrompt": {"mode": "append", "content": []}})
    with pytest.raises(PromptRejected) as rejected:
        table().begin("session/new", params, None)
    assert rejected.value.field == "_meta.systemPrompt.content"


def test_a_prompt_in_meta_is_taken_like_the_field() -> None:
    params = new_params(_meta={"systemPrompt": APPEND.to_wire(), "trace": "t"})
    step = table().begin("session/new", params, None)
    assert step.prompt == APPEND and step.client_sent_prompt
    assert step.params["_meta"] == {"trace": "t"}


def test_override_is_rejected_unless_the_delivery_offers_it() -> None:
    with pytest.raises(PromptRejected) as rejected:
        table(Delivery(append=True, override=False)).begin(
            "session/new", new_params(OVERRIDE), None
        )
    assert rejected.value.field == "systemPrompt.mode"
    step = table(Delivery(override=True)).begin("session/new", new_params(OVERRIDE), None)
    assert step.prompt == OVERRIDE


def test_an_agents_own_mode_is_taken_only_where_the_adapter_passes_it_on() -> None:
    custom = {"mode": "_vendor", "content": [{"type": "text", "text": "Hi."}]}
    with pytest.raises(PromptRejected) as rejected:
        table().begin("session/new", new_params(custom), None)
    assert rejected.value.field == "systemPrompt.mode"
    step = table(Delivery(custom_modes=("_vendor",))).begin("session/new", new_params(custom), None)
    assert step.prompt is not None and step.prompt.mode == "_vendor"


def test_the_configured_prompt_limit_applies() -> None:
    with pytest.raises(PromptRejected):
        table(max_prompt_bytes=4).begin("session/new", new_params(APPEND), None)


def test_a_prompt_sent_again_is_judged_once_and_is_the_same_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The usual session/new of a seen prompt: validated, fingerprinted and serialised once.
    judged: list[object] = []
    parse = system_prompt.parse_system_prompt

    def counting_parse(value: object, **rules: Any) -> SystemPrompt | None:
        judged.append(value)
        return parse(value, **rules)

    monkeypatch.setattr(sessions, "parse_system_prompt", counting_parse)
    sessions_table = table()
    first = sessions_table.begin("session/new", new_params(APPEND), None)
    again = sessions_table.begin("session/new", new_params(APPEND), None)
    assert again.prompt is first.prompt and again.client_sent_prompt
    assert again.params == {"cwd": "/", "mcpServers": []}
    assert len(judged) == 1
    other = sessions_table.begin("session/new", new_params(OTHER), None)
    assert other.prompt == OTHER and len(judged) == 2


def test_a_prompt_equal_to_the_last_only_in_python_is_judged_again() -> None:
    # 1 == 1.0 == True in Python; in JSON they are three values, stored as sent.
    sessions_table = table()
    wire = {**APPEND.to_wire(), "_meta": {"n": 1}}
    first = sessions_table.begin("session/new", new_params(wire), None)
    for value in (True, 1.0):
        step = sessions_table.begin(
            "session/new", new_params({**wire, "_meta": {"n": value}}), None
        )
        assert step.prompt is not None and step.prompt is not first.prompt
        assert step.prompt.to_wire()["_meta"] == {"n": value}
        assert type(step.prompt.to_wire()["_meta"]["n"]) is type(value)
    bad = {**wire, "content": [{"type": "text", "text": "Be brief.", "_meta": 1}]}
    sessions_table.begin("session/new", new_params(wire), None)
    with pytest.raises(PromptRejected):
        sessions_table.begin("session/new", new_params(bad), None)


def test_a_null_prompt_is_the_same_as_an_omitted_one() -> None:
    step = table().begin("session/load", {"sessionId": "s1", "systemPrompt": None}, Stored(OTHER))
    assert step.prompt == OTHER and not step.client_sent_prompt
    assert step.params == {"sessionId": "s1"}


# ------------------------------------------------------------------ §6 on_omitted


@pytest.mark.parametrize("method", ["session/load", "session/resume"])
def test_under_keep_an_omitted_prompt_is_the_stored_one(method: str) -> None:
    step = table().begin(method, session_params("s1"), Stored(APPEND, "fp"))
    assert (step.prompt, step.previous, step.delivered) == (APPEND, APPEND, "fp")
    assert not step.client_sent_prompt


def test_keep_is_the_policy_unless_another_is_configured() -> None:
    sessions_table = SessionTable("agent-cmd")
    sessions_table.initialized(v1_result(), Delivery(), intercepts_prompt=False)
    step = sessions_table.begin("session/load", session_params("s1"), Stored(APPEND))
    assert step.prompt == APPEND and not step.client_sent_prompt
    assert sessions_table.on_omitted == "keep"


def test_under_keep_a_fork_inherits_its_parents_prompt() -> None:
    step = table().begin("session/fork", session_params("parent"), Stored(APPEND))
    assert step.session_id == "parent" and step.prompt == APPEND


@pytest.mark.parametrize("method", ["session/load", "session/resume", "session/fork"])
def test_under_default_an_omitted_prompt_is_the_agents_own(method: str) -> None:
    step = table(on_omitted="default").begin(method, session_params("s1"), Stored(APPEND))
    assert step.prompt is None and step.previous == APPEND


def test_under_default_a_load_without_a_prompt_stores_none() -> None:
    sessions_table = table(on_omitted="default")
    step = sessions_table.begin("session/load", session_params("s1"), Stored(APPEND))
    outcome = sessions_table.answered(step, result={})
    assert outcome.writes == (SaveSession("s1", None),)


@pytest.mark.parametrize("method", ["session/load", "session/resume", "session/fork"])
def test_under_keep_a_stored_prompt_this_delivery_cannot_carry_is_not_filled_in(
    method: str, caplog: pytest.LogCaptureFixture
) -> None:
    step = table(Delivery(override=False)).begin(method, session_params("s1"), Stored(OVERRIDE))
    assert step.prompt is None and step.previous == OVERRIDE
    assert "cannot be delivered here" in caplog.text


def test_a_new_session_without_a_prompt_runs_with_none_under_either_policy() -> None:
    for policy in ("keep", "default"):
        step = table(on_omitted=policy).begin("session/new", new_params(), None)
        assert step.prompt is None and step.previous is None


def test_a_prompt_sent_on_load_replaces_the_stored_one_which_stays_previous() -> None:
    step = table().begin("session/resume", session_params("s1", OTHER), Stored(APPEND))
    assert (step.prompt, step.previous, step.client_sent_prompt) == (OTHER, APPEND, True)


@pytest.mark.parametrize("method", ["session/close", "session/delete", "session/prompt"])
def test_close_delete_and_prompt_run_with_the_stored_prompt_and_untouched_params(
    method: str,
) -> None:
    params = session_params("s1", OTHER)  # not a lifecycle field here: passed on as sent
    step = table().begin(method, params, Stored(APPEND, "fp"))
    assert step.params == params and step.params is not params
    assert (step.prompt, step.previous, step.delivered) == (APPEND, APPEND, "fp")
    assert not step.client_sent_prompt


def test_an_unknown_session_runs_with_nothing_stored() -> None:
    step = table().begin("session/load", session_params("s9"), None)
    assert (step.prompt, step.previous, step.delivered) == (None, None, None)


def test_an_unknown_on_omitted_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="keep, default"):
        SessionTable("agent-cmd", on_omitted="forget")


def test_a_lifecycle_request_before_initialize_is_a_bug_of_the_caller() -> None:
    with pytest.raises(RuntimeError):
        SessionTable("agent-cmd").begin("session/new", new_params(APPEND), None)


# ------------------------------------------------------------- §6 what is stored


def test_new_stores_the_prompt_as_a_new_conversation_and_opens_the_session() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/new", new_params(APPEND), None)
    outcome = sessions_table.answered(step, result={"sessionId": "s1"})
    assert outcome == Outcome((SaveSession("s1", APPEND, new_conversation=True),), opened="s1")


def test_new_without_a_prompt_is_stored_too() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/new", new_params(), None)
    outcome = sessions_table.answered(step, result={"sessionId": "s1"})
    assert outcome.writes == (SaveSession("s1", None, new_conversation=True),)


@pytest.mark.parametrize("method", ["session/load", "session/resume"])
def test_load_and_resume_store_the_prompt_in_the_same_conversation(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("s1", OTHER), Stored(APPEND, "fp"))
    outcome = sessions_table.answered(step, result={})
    assert outcome == Outcome((SaveSession("s1", OTHER),), opened="s1")


def test_fork_stores_the_new_id_as_a_new_conversation_with_its_parent() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/fork", session_params("parent", OTHER), Stored(APPEND))
    outcome = sessions_table.answered(step, result={"sessionId": "child"})
    assert outcome == Outcome(
        (SaveSession("child", OTHER, parent_id="parent", new_conversation=True),),
        opened="child",
    )


def test_a_fork_of_a_conversation_holding_its_prompt_holds_it_too() -> None:
    sessions_table = table()
    stored = Stored(APPEND, APPEND.fingerprint())
    step = sessions_table.begin("session/fork", session_params("parent"), stored)
    outcome = sessions_table.answered(step, result={"sessionId": "child"})
    assert outcome.writes[1:] == (SetDelivered("child", APPEND.fingerprint()),)


def test_a_fork_with_another_prompt_does_not_hold_the_parents_delivered_one() -> None:
    sessions_table = table()
    stored = Stored(APPEND, APPEND.fingerprint())
    step = sessions_table.begin("session/fork", session_params("parent", OTHER), stored)
    outcome = sessions_table.answered(step, result={"sessionId": "child"})
    assert [type(write) for write in outcome.writes] == [SaveSession]


def test_close_marks_the_session_not_live() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/close", session_params("s1"), Stored(APPEND))
    assert sessions_table.answered(step, result={}) == Outcome((MarkClosed("s1"),), closed="s1")


def test_a_close_answered_resource_not_found_marks_the_session_not_live() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/close", session_params("s1"), Stored(APPEND))
    error = {"code": -32002, "message": "Session not found"}
    assert sessions_table.answered(step, error=error) == Outcome((MarkClosed("s1"),), closed="s1")


def test_delete_forgets_the_session() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/delete", session_params("s1"), Stored(APPEND))
    assert sessions_table.answered(step, result={}) == Outcome((Forget("s1"),), closed="s1")


@pytest.mark.parametrize("method", sorted(SESSION_METHODS | {"session/prompt"}))
def test_a_request_the_agent_refused_stores_nothing(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("s1", APPEND), Stored(OTHER))
    error = {"code": -32603, "message": "no"}
    assert sessions_table.answered(step, error=error, delivered_now="fp") == Outcome()


@pytest.mark.parametrize("method", ["session/new", "session/fork"])
def test_an_answer_without_a_new_session_id_opens_nothing(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("parent"), Stored(APPEND))
    for result in ({}, {"sessionId": 5}, None, ["x"]):
        assert sessions_table.answered(step, result=result).opened is None


@pytest.mark.parametrize("method", ["session/load", "session/close", "session/prompt"])
def test_a_request_without_a_session_id_stores_nothing(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, {"sessionId": ["s1"]}, None)
    assert sessions_table.answered(step, result={}, delivered_now="fp") == Outcome()


def test_a_prompt_the_adapter_delivered_becomes_the_sessions_delivered_fingerprint() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/prompt", session_params("s1"), Stored(APPEND))
    outcome = sessions_table.answered(
        step, result={"stopReason": "end_turn"}, delivered_now=APPEND.fingerprint()
    )
    assert outcome == Outcome((SetDelivered("s1", APPEND.fingerprint()),))
    assert sessions_table.answered(step, result={"stopReason": "end_turn"}) == Outcome()


def test_the_fingerprint_is_of_what_reaches_the_model() -> None:
    same_text_other_meta = SystemPrompt.from_wire({**APPEND.to_wire(), "_meta": {"k": 1}})
    assert same_text_other_meta.fingerprint() == APPEND.fingerprint()
    assert OVERRIDE.fingerprint() != SystemPrompt.of_text("append", OVERRIDE.text).fingerprint()


# ------------------------------------------------------------------------ live


def test_an_opened_session_is_live_only_once_recorded() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/new", new_params(APPEND), None)
    outcome = sessions_table.answered(step, result={"sessionId": "s1"})
    assert "s1" not in sessions_table.live
    sessions_table.recorded(outcome)
    assert sessions_table.live == {"s1"}


@pytest.mark.parametrize("method", ["session/load", "session/resume", "session/fork"])
def test_load_resume_and_fork_make_a_session_live(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(step, result={"sessionId": "s2"}))
    assert sessions_table.live == {"s2" if method == "session/fork" else "s1"}


@pytest.mark.parametrize("method", ["session/close", "session/delete"])
def test_close_and_delete_end_a_live_session(method: str) -> None:
    sessions_table = table()
    opened = sessions_table.begin("session/load", session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(opened, result={}))
    step = sessions_table.begin(method, session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(step, result={}))
    assert sessions_table.live == set()


def test_a_prompt_turn_changes_nothing_live() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/prompt", session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(step, result={}))
    assert sessions_table.live == set()


# ------------------------------------------------------------------ withdrawing


def _failed(sessions_table: SessionTable, step: Step, result: Any, agent: JsonObject) -> Any:
    outcome = sessions_table.answered(step, result=result)
    return sessions_table.record_failed(outcome, "database is locked", agent)


def test_a_failed_write_withdraws_the_new_session_with_close_where_offered() -> None:
    sessions_table = table()
    step = sessions_table.begin("session/new", new_params(APPEND), None)
    failed = _failed(sessions_table, step, {"sessionId": "s1"}, v1_result(close={}))
    assert failed.withdraw == Withdraw("s1", ("session/close",))
    assert failed.withdraw.params == {"sessionId": "s1"}
    assert failed.error["code"] == INTERNAL_ERROR
    assert "database is locked" in failed.error["message"]
    assert sessions_table.live == set()


@pytest.mark.parametrize("method", ["session/load", "session/resume", "session/fork"])
def test_a_failed_write_withdraws_every_session_opened_for_the_request(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("s1"), Stored(APPEND))
    failed = _failed(sessions_table, step, {"sessionId": "s2"}, v1_result(close={}))
    expected = "s2" if method == "session/fork" else "s1"
    assert failed.withdraw == Withdraw(expected, ("session/close",))


def test_a_session_live_before_a_failed_reload_is_live_no_more() -> None:
    sessions_table = table()
    opened = sessions_table.begin("session/load", session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(opened, result={}))
    again = sessions_table.begin("session/load", session_params("s1", OTHER), Stored(APPEND))
    _failed(sessions_table, again, {}, v1_result(close={}))
    assert sessions_table.live == set()


@pytest.mark.parametrize("method", sorted(OPENING))
def test_a_failed_adapter_step_withdraws_the_session_the_agent_opened(method: str) -> None:
    sessions_table = table()
    opened = sessions_table.begin("session/load", session_params("s1"), Stored(APPEND))
    sessions_table.recorded(sessions_table.answered(opened, result={}))
    step = sessions_table.begin(method, session_params("s1", OTHER), Stored(APPEND))
    withdraw = sessions_table.step_failed(step, {"sessionId": "s2"}, v1_result(delete={}))
    expected = "s2" if method in ("session/new", "session/fork") else "s1"
    assert withdraw == Withdraw(expected, ("session/delete",))
    assert sessions_table.live == ({"s1"} if expected == "s2" else set())


@pytest.mark.parametrize("method", ["session/close", "session/delete", "session/prompt"])
def test_a_failed_adapter_step_that_opened_nothing_withdraws_nothing(method: str) -> None:
    sessions_table = table()
    step = sessions_table.begin(method, session_params("s1"), Stored(APPEND))
    assert sessions_table.step_failed(step, {}, v1_result(close={})) is None
    step = sessions_table.begin("session/new", new_params(APPEND), None)
    assert sessions_table.step_failed(step, {"sessionId": 7}, v1_result(close={})) is None


def test_withdrawing_tries_close_then_delete_where_both_are_offered() -> None:
    assert withdraw_methods(v1_result(close={}, delete={})) == ("session/close", "session/delete")
    assert withdraw_methods(v1_result(delete={})) == ("session/delete",)


def test_in_version_1_a_session_cannot_be_withdrawn_without_close_or_delete() -> None:
    assert withdraw_methods(v1_result(list={}, resume={})) == ()
    assert withdraw_methods(v1_result(close=None)) == ()  # null: not offered
    sessions_table = table()
    step = sessions_table.begin("session/new", new_params(APPEND), None)
    failed = _failed(sessions_table, step, {"sessionId": "s1"}, v1_result())
    assert failed.withdraw == Withdraw("s1", ())


def test_in_version_2_every_agent_with_session_methods_can_close() -> None:
    assert withdraw_methods(v2_result(session={})) == ("session/close",)
    assert withdraw_methods(v2_result(session={"delete": {}})) == (
        "session/close",
        "session/delete",
    )


def test_in_version_2_an_agent_without_session_methods_cannot_close() -> None:
    assert withdraw_methods(v2_result(session=None)) == ()


def test_withdrawing_is_done_when_the_agent_no_longer_has_the_session() -> None:
    assert Withdraw.done(None)
    assert Withdraw.done({"code": -32002, "message": "Session not found"})
    assert not Withdraw.done({"code": -32603, "message": "failed"})


def test_a_failed_write_for_close_or_delete_answers_an_error_and_withdraws_nothing() -> None:
    for method in ("session/close", "session/delete"):
        sessions_table = table()
        step = sessions_table.begin(method, session_params("s1"), Stored(APPEND))
        failed = _failed(sessions_table, step, {}, v1_result(close={}))
        assert failed.withdraw is None and failed.error["code"] == INTERNAL_ERROR


# --------------------------------------------------------- the table in the docs

ARCHITECTURE = Path(__file__).parents[1] / "docs" / "architecture.md"


def test_every_test_the_lifecycle_rules_table_names_exists() -> None:
    text = ARCHITECTURE.read_text()
    section = text.split("## Lifecycle rules and their tests", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", section)
    assert len(named) > 40
    defined: dict[str, set[str]] = {}
    missing = []
    for file, name in named:
        if file not in defined:
            tree = ast.parse((ARCHITECTURE.parents[1] / file).read_text())
            defined[file] = {
                node.name
                for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        if name not in defined[file]:
            missing.append(f"{file}::{name}")
    assert missing == []
    validation = (ARCHITECTURE.parents[1] / "tests" / "test_validation.py").read_text()
    for row in section.splitlines():
        for case in re.findall(r"`(\w+)`", row.partition("cases ")[2]):
            assert re.search(rf'\(\s*"{case}",', validation), case


# ------------------------------------------------------------------------- sans-IO

IO_MODULES = {"trio", "subprocess", "sqlite3", "socket", "threading", "asyncio"}


def test_nothing_in_the_core_imports_io() -> None:
    core = Path(sessions.__file__).parent
    found = []
    for module in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{module.name}: {n}" for n in names if n.split(".")[0] in IO_MODULES]
    assert found == []
