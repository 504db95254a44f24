"""``codex``: codex-acp, with one process per distinct system prompt where it needs one.

Two generations share the adapter. ``@agentclientprotocol/codex-acp`` 2.3 and later (the
registry's codex-acp, on codex's app-server) take ``systemPrompt`` natively in append mode
only. The native capability is used for what it covers: an append prompt (and any ``_``
mode it advertises) passes through in the request, and those sessions live in the
primary process. The bridge adds only what it lacks: an override prompt gets a process of
its own whose ``CODEX_CONFIG`` (the JSON configuration 2.x reads from its environment; it
ignores command-line arguments) is the user's plus ``model_instructions_file`` naming a
private file; codex then puts that file where its default instructions would be, the
first developer item (codex 0.166 sends no ``instructions`` field). 2.x reads that file
when a session starts, so the pool can keep a spare override process (``spare: true``)
whose file is written when it is claimed. 2.0 to 2.2, without the native capability, are
not recognised (the first-turn route serves them).

``codex-acp`` 0.16 (``@zed-industries/codex-acp``, the ``codex-legacy`` preset) reads
instructions only from its process configuration, loaded once at start:
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

What a reopened session (``session/load`` / ``session/resume``) gets, measured on 0.16.0
and again on 2.6.0: the developer message is part of the stored conversation and cannot
change after ``session/new`` (2.6.0 takes a changed append on a reopen without an error
and does not apply it, live or after a restart); the base instructions are stored too,
but a process started with an override replaces them. A fork on 2.6.0 copies its parent's
developer message the same way. :func:`reopen_effect` spells this out; changes that
cannot apply are logged on stderr.

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

from acp_bridge.adapter import (
    AdapterContext,
    Delivery,
    LifecycleCall,
    ReopenLimit,
    Reply,
    put_prompt_back,
)
from acp_bridge.builtin_adapters import recognised
from acp_bridge.core.capabilities import agent_name, native_delivery
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, prompt_key
from acp_bridge.wire.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonObject

AGENT_NAME: Final = "codex-acp"
# The TypeScript codex-acp on codex's app-server (2.x): configuration from the environment.
# Recognised only with its native append (builtin_adapters.NEEDS_NATIVE).
APP_SERVER_AGENT_NAME: Final = "@agentclientprotocol/codex-acp"
AGENT_NAMES: Final = frozenset({AGENT_NAME, APP_SERVER_AGENT_NAME})
CONFIG_VARIABLE: Final = "CODEX_CONFIG"
# codex-acp answers session/close before it has released the session's rollout writer, so
# a load/resume right after fails: 0.16 with -32603 (its stderr: "already has a live local
# writer"), 2.6 with -32600 and data.reason "thread_active_writer". Such a reopen is
# retried until the close is this old.
CLOSE_SETTLE_TIMEOUT: Final = 3.0
ACTIVE_WRITER: Final = "thread_active_writer"
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


def reopen_effect(
    created_with: SystemPrompt | None, wanted: SystemPrompt | None
) -> list[ReopenLimit]:
    """What of ``wanted`` cannot reach the model when a session created with
    ``created_with`` is reopened in ``wanted``'s process; one limit per problem, each
    saying what the model receives instead.

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
            ReopenLimit(
                "codex keeps a session's developer instructions from session/new; "
                "the new append prompt is not added",
                receives_created=old_append is not None,
                misses=(wanted,),
            )
        )
    if old_append is not None and (wanted is None or wanted.mode == "override"):
        problems.append(
            ReopenLimit(
                "the append prompt the session was created with stays in its history",
                receives_created=True,
            )
        )
    if old_override is not None and (wanted is None or wanted.mode == "append"):
        problems.append(
            ReopenLimit(
                "the override prompt the session was created with stays its base instructions",
                receives_created=True,
            )
        )
    return problems


def is_app_server(initialize_result: JsonObject | None) -> bool:
    """Whether the agent is the 2.x codex-acp, configured through its environment."""
    return initialize_result is not None and agent_name(initialize_result) == APP_SERVER_AGENT_NAME


class CodexAdapter(PoolAdapter):
    name = "codex"
    description = "codex-acp: native append where it has it, one process per other prompt"
    agent_label = "codex-acp"
    reported_name = AGENT_NAME
    close_settle_timeout = CLOSE_SETTLE_TIMEOUT
    close_retry_interval = CLOSE_RETRY_INTERVAL
    # 2.6 keeps a closed session's writer until the process exits (measured: still refused
    # 40 s after the close); 0.16 lets go within CLOSE_SETTLE_TIMEOUT.
    released_on_exit = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._native_of: JsonObject | None = None
        self._native_delivery: Delivery | None = None

    @classmethod
    def detect(cls, initialize_result: JsonObject) -> bool:
        name = agent_name(initialize_result)
        native = native_delivery(initialize_result) is not None
        return name in AGENT_NAMES and recognised(name, native)

    def delivery(self, initialize_result: JsonObject) -> Delivery | None:
        if not is_app_server(initialize_result):
            return Delivery(append=True, override=True)
        native = native_delivery(initialize_result)
        if native is None:
            # 2.0-2.2: no native append, and no per-process append route proven.
            return None
        return Delivery(append=True, override=True, custom_modes=native.custom_modes)

    def _native(self) -> Delivery | None:
        """What the agent takes itself (2.x: append), from the primary's initialize: read
        once per answer, as every lifecycle call asks."""
        result = self.context.primary.initialize_result
        if result is not self._native_of:
            self._native_of = result
            self._native_delivery = (
                native_delivery(result) if result is not None and is_app_server(result) else None
            )
        return self._native_delivery

    def process_prompt(self, prompt: SystemPrompt | None) -> SystemPrompt | None:
        native = self._native()
        if prompt is not None and native is not None and native.accepts(prompt.mode):
            return None  # the primary takes it in the request
        return prompt

    def _pass_natively(self, call: LifecycleCall) -> None:
        if call.prompt is not None and self.process_prompt(call.prompt) is None:
            put_prompt_back(call)

    async def session_new(self, call: LifecycleCall) -> Reply:
        self._pass_natively(call)
        return await super().session_new(call)

    async def session_fork(self, call: LifecycleCall) -> Reply:
        self._pass_natively(call)
        return await super().session_fork(call)

    async def session_load(self, call: LifecycleCall) -> Reply:
        self._pass_natively(call)
        return await super().session_load(call)

    async def session_resume(self, call: LifecycleCall) -> Reply:
        self._pass_natively(call)
        return await super().session_resume(call)

    def still_releasing(self, error: JsonObject) -> bool:
        data = error.get("data")
        reason = data.get("reason") if isinstance(data, dict) else None
        return super().still_releasing(error) or (
            error.get("code") == INVALID_REQUEST and reason == ACTIVE_WRITER
        )

    @classmethod
    def reopen_limits(
        cls, previous: SystemPrompt | None, prompt: SystemPrompt | None
    ) -> list[ReopenLimit]:
        return reopen_effect(previous, prompt)

    @classmethod
    def fork_limits(
        cls, parent: SystemPrompt | None, prompt: SystemPrompt | None
    ) -> list[ReopenLimit]:
        # A fork starts from its parent's stored conversation, developer message included.
        return reopen_effect(parent, prompt)

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
        if is_app_server(self.context.primary.initialize_result):
            return self._app_server_config(prompt, private)
        if prompt.mode == "append":
            home = self._user_home()
            if home is not None and private.path.parent == home:
                overlay = private_codex_home(home, private, prompt.text)
                if overlay is not None:
                    return overlay
            value = "developer_instructions=" + toml_string(prompt.text)
            check_arg(value)
            return ProcessConfig(args=["-c", value])
        check_override_text(prompt)
        path = private.write(INSTRUCTIONS_FILE, prompt.text)
        return ProcessConfig(args=["-c", "model_instructions_file=" + toml_string(str(path))])

    def _app_server_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        """2.x: an override process; the user's CODEX_CONFIG plus the instructions file."""
        # Only override comes here: append (and any mode the agent advertises) is native.
        check_override_text(prompt)
        return super().process_config(prompt, private)

    def spares_for(self, mode: str) -> bool:
        # 2.6 reads model_instructions_file when a session starts (a file written after
        # initialize reaches the model, tests/e2e/test_codex_acp.py); 0.16 reads its
        # configuration when the process starts.
        return mode == "override" and is_app_server(self.context.primary.initialize_result)

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        config = user_codex_config(self.agent_variable(CONFIG_VARIABLE))
        config["model_instructions_file"] = str(private.path / INSTRUCTIONS_FILE)
        return ProcessConfig(env={CONFIG_VARIABLE: json.dumps(config, ensure_ascii=False)})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        check_override_text(prompt)
        private.write(INSTRUCTIONS_FILE, prompt.text)


def check_override_text(prompt: SystemPrompt) -> None:
    if not prompt.text.strip():
        # codex trims the file and refuses to start on an empty one.
        raise PromptRefused(
            "codex-acp cannot take an override system prompt that is only whitespace.",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        )


def user_codex_config(value: str | None) -> dict[str, object]:
    """The user's own ``CODEX_CONFIG`` (a JSON object), which an override process keeps."""
    if not value:
        return {}
    try:
        config = json.loads(value)
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise PromptRefused(
            f"The agent's {CONFIG_VARIABLE} is not a JSON object, so the bridge cannot add "
            "the override system prompt to it."
        )
    return config


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
