"""``codex``: one codex-acp process per distinct system prompt, presented as one agent.

codex-acp reads instructions only from its process configuration, loaded once at start:
``developer_instructions`` adds a developer message (append) and
``-c model_instructions_file=<file>`` replaces the base instructions (override).

The append text is kept off the command line where the agent's environment is known
(``PoolAdapter.agent_environment``): the process gets a private ``CODEX_HOME`` (a 0700
folder inside the user's, removed with the process) whose ``config.toml`` is the user's
with ``developer_instructions`` added, and which links every other entry of the user's
home, so sessions, credentials and skills stay shared (:func:`private_codex_home`).
Otherwise, or when the user's own config.toml sets ``developer_instructions``, it goes as
``-c developer_instructions=<TOML string>``, readable in the process list. Nothing
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
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from acp_bridge.jsonrpc import INVALID_PARAMS
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
CONFIG_FILE: Final = "config.toml"
# Folders every codex process of one user must share: rollouts (load, resume, list).
SHARED_DIRS: Final = ("sessions", "archived_sessions")
# The pool's private directories (acp_bridge.pool.PrivateDir) for this adapter.
PRIVATE_PREFIX: Final = "acp-bridge-codex-"
TABLE_HEADER: Final = re.compile(r"^\s*\[")


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
    reported_name = AGENT_NAME
    close_settle_timeout = CLOSE_SETTLE_TIMEOUT
    close_retry_interval = CLOSE_RETRY_INTERVAL

    @classmethod
    def reopen_limits(cls, previous: SystemPrompt | None, prompt: SystemPrompt | None) -> list[str]:
        return reopen_effect(previous, prompt)

    def private_root(self) -> Path | None:
        # Inside the user's CODEX_HOME: codex refuses to put its helper binaries under the
        # temporary folder, and a private CODEX_HOME is one of these directories.
        home = self._user_home()
        return home if home is not None else None

    def _user_home(self) -> Path | None:
        """The CODEX_HOME codex uses, when the agent's environment is known."""
        environment = self.agent_environment()
        if environment is None:
            return None
        home = codex_home(environment)
        return home if home.is_dir() else None

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        if prompt.mode == "append":
            home = self._user_home()
            if home is not None and private.path.parent == home:
                overlay = private_codex_home(home, private, prompt.text)
                if overlay is not None:
                    return overlay
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


def codex_home(environment: Mapping[str, str]) -> Path:
    """Where codex keeps its configuration and sessions: ``$CODEX_HOME`` or ``~/.codex``."""
    configured = environment.get("CODEX_HOME")
    if configured:
        return Path(configured)
    return Path(environment.get("HOME") or Path.home()) / ".codex"


def sets_top_level(config: str, key: str) -> bool:
    """Whether TOML text sets ``key`` in its root table (before the first table header)."""
    pattern = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*=""")
    for line in config.splitlines():
        if TABLE_HEADER.match(line):
            return False
        if pattern.match(line):
            return True
    return False


def private_codex_home(home: Path, private: PrivateDir, text: str) -> ProcessConfig | None:
    """A CODEX_HOME that is ``home`` except for a config.toml holding ``text``.

    Every entry of ``home`` is linked in (sessions, credentials, skills, ...); ``sessions``
    and ``archived_sessions`` are made first so what this process writes lands in the
    user's home, and the SQLite state stays there through ``CODEX_SQLITE_HOME``. None when
    the user's config.toml sets developer_instructions itself: a second root key would
    be a TOML error, so the prompt then goes on the command line as before.
    """
    user_config_file = home / CONFIG_FILE
    user_config = user_config_file.read_text(encoding="utf-8") if user_config_file.is_file() else ""
    if sets_top_level(user_config, "developer_instructions"):
        return None
    for shared in SHARED_DIRS:
        (home / shared).mkdir(exist_ok=True)
    for entry in sorted(home.iterdir()):
        if entry.name != CONFIG_FILE and not entry.name.startswith(PRIVATE_PREFIX):
            private.link(entry.name, entry)
    # Root keys must come before the user's first table header.
    private.write(CONFIG_FILE, f"developer_instructions = {toml_string(text)}\n{user_config}")
    return ProcessConfig(env={"CODEX_HOME": str(private.path), "CODEX_SQLITE_HOME": str(home)})


def check_arg(value: str) -> None:
    size = len(value.encode())
    if size > MAX_ARG_BYTES:
        raise PromptRefused(
            f"The append system prompt is too long for codex-acp's command line "
            f"({size} bytes encoded, at most {MAX_ARG_BYTES}).",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        )
