"""``codex``: one codex-acp process per distinct system prompt, presented as one agent.

codex-acp reads instructions only from its process configuration, loaded once at start:
``-c developer_instructions=<TOML string>`` adds a developer message (append) and
``-c model_instructions_file=<file>`` replaces the base instructions (override). Nothing
in an ACP session can change them, so this adapter is a :class:`~acp_bridge.pool.PoolAdapter`:
one codex-acp process per distinct prompt, sessions routed by id, the primary answering
sessions without a prompt and every connection-wide method. codex keeps sessions on disk
under ``CODEX_HOME``, shared by every process, so ``session/list`` is answered once, by the
primary, and any process can load any session.

What a reopened session (``session/load`` / ``session/resume``) gets, measured on 0.16.0:
the developer message is part of the stored conversation and cannot change after
``session/new``; the base instructions are stored too, but a process started with an
override replaces them. :func:`reopen_effect` spells this out; changes that cannot apply
are logged on stderr.

Pool options (``idle_timeout``, ``max_processes``) come from
``bridge.adapter_options.codex``. codex-acp answers ``session/close`` before it has released
the session, so a reopen refused right after a close is retried for a moment.
"""

from __future__ import annotations

import json
from typing import Final

from acp_bridge.jsonrpc import INVALID_PARAMS, JsonObject
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, prompt_key
from acp_bridge.system_prompt import SystemPrompt

AGENT_NAME: Final = "codex-acp"
# codex-acp answers session/close before it has released the session's rollout writer, so
# a load/resume right after fails with -32603 (its stderr: "already has a live local
# writer"). Such a reopen is retried until the close is this old.
CLOSE_SETTLE_TIMEOUT: Final = 3.0
CLOSE_RETRY_INTERVAL: Final = 0.1
# Linux refuses a single argv string longer than MAX_ARG_STRLEN (32 pages, NUL included).
MAX_ARG_BYTES: Final = 32 * 4096 - 1
INSTRUCTIONS_FILE: Final = "instructions.md"


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, for ``-c key=<value>``.

    JSON's escapes are all valid TOML except that TOML also forbids a raw DEL; codex
    falls back to taking the whole value literally (quotes included) if it is not TOML.
    """
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def reopen_effect(created_with: SystemPrompt | None, wanted: SystemPrompt | None) -> list[str]:
    """What of ``wanted`` cannot reach the model when a session created with
    ``created_with`` is reopened in ``wanted``'s process; one sentence per problem.

    codex stores the developer message in the conversation at ``session/new`` and the
    base instructions in the session's metadata; only an explicit override replaces
    the stored base instructions on reopen.
    """
    if prompt_key(created_with) == prompt_key(wanted):
        return []
    problems = []
    old_append = created_with if created_with and created_with.mode == "append" else None
    old_override = created_with if created_with and created_with.mode == "override" else None
    if wanted is not None and wanted.mode == "append":
        problems.append(
            "codex keeps a session's developer instructions from session/new; "
            "the new append prompt is not added"
        )
    if old_append is not None and (wanted is None or wanted.mode == "override"):
        problems.append("the append prompt the session was created with stays in its history")
    if old_override is not None and (wanted is None or wanted.mode == "append"):
        problems.append(
            "the override prompt the session was created with stays its base instructions"
        )
    return problems


class CodexAdapter(PoolAdapter):
    name = "codex"
    description = "codex-acp: one process per distinct prompt, sessions routed by id"
    agent_label = "codex-acp"
    close_settle_timeout = CLOSE_SETTLE_TIMEOUT
    close_retry_interval = CLOSE_RETRY_INTERVAL

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        info = initialize_result.get("agentInfo")
        return isinstance(info, dict) and info.get("name") == AGENT_NAME

    @classmethod
    def reopen_limits(cls, previous: SystemPrompt | None, prompt: SystemPrompt | None) -> list[str]:
        return reopen_effect(previous, prompt)

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        if prompt.mode == "append":
            value = "developer_instructions=" + toml_string(prompt.text)
            check_arg(value)
            return ProcessConfig(args=["-c", value])
        if not prompt.text.strip():
            # codex trims the file and refuses to start on an empty one.
            raise PromptRefused(
                "codex-acp cannot take an override system prompt that is only whitespace.",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )
        path = private.write(INSTRUCTIONS_FILE, prompt.text)
        return ProcessConfig(args=["-c", "model_instructions_file=" + toml_string(str(path))])


def check_arg(value: str) -> None:
    size = len(value.encode())
    if size > MAX_ARG_BYTES:
        raise PromptRefused(
            f"The append system prompt is too long for codex-acp's command line "
            f"({size} bytes encoded, at most {MAX_ARG_BYTES}).",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        )
