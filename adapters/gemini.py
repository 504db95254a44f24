"""``gemini``: one ``gemini --acp`` process per distinct system prompt.

gemini-cli (``@google/gemini-cli``, measured on 0.61.0) takes no prompt over ACP; it builds
its system instruction once per process from files, so this is a
:class:`~acp_bridge.pool.PoolAdapter`:

* **override**: a process with ``GEMINI_SYSTEM_MD=<private file>``. gemini reads that file
  instead of its default prompt and substitutes ``${AgentSkills}``, ``${SubAgents}``,
  ``${AvailableTools}`` and ``${<tool>_ToolName}`` in it; there is no escape. The bridge
  writes those placeholders with a WORD JOINER (U+2060) between ``$`` and ``{``
  (:func:`protect_placeholders`), so the model sees them, one invisible character apart,
  instead of gemini's tool list. gemini still adds the user's own memory (``GEMINI.md``)
  after the text, as it does after its default prompt.
* **append**: a process whose ``GEMINI_CLI_HOME`` is a private home. Its ``.gemini``
  folder links every entry of the user's own ``~/.gemini`` (credentials, memory, history)
  except ``settings.json``, which is a private copy of the user's settings with one more
  context file named in ``context.fileName`` and ``context.importFormat: "flat"`` (so a
  line starting with ``@`` stays text). gemini puts context files at the end of its
  system instruction, the bridge's after the user's own; nothing is written into the
  user's ``~/.gemini``.

What gemini does to any prompt text: leading and trailing whitespace is trimmed and runs
of three or more newlines become two (it does that to its whole system instruction).

Each file is written once, when its process starts, and never rewritten: gemini re-reads
them for every live session of the process whenever one session reloads its memory.
gemini reads the context file only when a session starts (a file written after
``initialize`` reaches the model, ``tests/e2e/test_gemini.py``), so for append prompts the
pool keeps a spare process whose private home is ready but for that file, written when
the next new append prompt claims it. ``GEMINI_SYSTEM_MD`` is read during ``initialize``
(gemini 0.61.0 refuses to initialize while the file is missing): no spare for override.

gemini 0.61.0 advertises ``loadSession`` but its ``session/load`` fails ("No previous
sessions found for this project."): the bridge passes that answer on unchanged. It has
no ``session/resume``, ``session/fork``, ``session/close`` or ``session/list``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused
from acp_bridge.wire.jsonrpc import INVALID_PARAMS, JsonObject

AGENT_NAME: Final = "gemini-cli"
GEMINI_DIR: Final = ".gemini"
SETTINGS_FILE: Final = "settings.json"
# gemini's own default context file name, used when the user's settings name none.
DEFAULT_CONTEXT_FILE: Final = "GEMINI.md"
# The bridge's context file: a name no project is likely to use for its own.
APPEND_FILE: Final = "acp-bridge-system-prompt.md"
OVERRIDE_FILE: Final = "system.md"
# What gemini substitutes in a GEMINI_SYSTEM_MD file (0.61.0, promptProvider.ts).
PLACEHOLDER: Final = re.compile(
    r"\$(?=\{(?:AgentSkills|SubAgents|AvailableTools|[^}]*_ToolName)\})"
)
WORD_JOINER: Final = "\u2060"
# Versions whose session/load was measured failing for every session.
LOAD_BROKEN_VERSIONS: Final = frozenset({"0.61.0"})


def protect_placeholders(text: str) -> str:
    """``text`` with every ``${…}`` gemini would substitute written ``$\\u2060{…}``."""
    return PLACEHOLDER.sub("$" + WORD_JOINER, text)


def user_gemini_dir(environ: Mapping[str, str]) -> Path:
    """The user's own ``.gemini`` folder, as gemini finds it."""
    home = environ.get("GEMINI_CLI_HOME") or environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / GEMINI_DIR


def merged_settings(user_settings: Path) -> JsonObject:
    """The user's settings plus the bridge's context file, for the private home.

    Raises PromptRefused when the user's file cannot be read as a JSON object: carrying
    half of it over would change how gemini behaves for the user.
    """
    settings: Any = {}
    if user_settings.is_file():
        try:
            settings = json.loads(user_settings.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PromptRefused(
                f"The bridge cannot carry {user_settings} over to gemini's private home "
                f"for an append prompt: {exc}",
                {"file": str(user_settings)},
            ) from exc
        if not isinstance(settings, dict):
            raise PromptRefused(
                f"{user_settings} is not a JSON object; the bridge cannot carry it over.",
                {"file": str(user_settings)},
            )
    context = settings.get("context")
    context = dict(context) if isinstance(context, dict) else {}
    names = context.get("fileName", DEFAULT_CONTEXT_FILE)
    names = [names] if isinstance(names, str) else list(names)
    context["fileName"] = [*names, APPEND_FILE]
    context["importFormat"] = "flat"
    return {**settings, "context": context}


class GeminiAdapter(PoolAdapter):
    name = "gemini"
    description = "gemini --acp: one process per distinct prompt (GEMINI_SYSTEM_MD, context file)"
    agent_label = "gemini"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"append"})

    @classmethod
    def broken_methods(cls, initialize_result: JsonObject) -> dict[str, str]:
        info = initialize_result.get("agentInfo")
        version = info.get("version") if isinstance(info, dict) else None
        if version in LOAD_BROKEN_VERSIONS:
            return {
                "session/load": f"gemini-cli {version} advertises loadSession but its "
                "session/load fails upstream (No previous sessions found for this project.)"
            }
        return {}

    def process_config(self, prompt: SystemPrompt, private: PrivateDir) -> ProcessConfig:
        check_not_blank(prompt)
        if prompt.mode == "override":
            path = private.write(OVERRIDE_FILE, protect_placeholders(prompt.text))
            return ProcessConfig(env={"GEMINI_SYSTEM_MD": str(path)})
        return super().process_config(prompt, private)

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        return ProcessConfig(env={"GEMINI_CLI_HOME": str(self._private_home(private))})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        check_not_blank(prompt)
        private.write(f"{GEMINI_DIR}/{APPEND_FILE}", prompt.text)

    def _private_home(self, private: PrivateDir) -> Path:
        """A home whose ``.gemini`` is the user's, plus settings naming the bridge's
        context file (written by :meth:`fill_spare`)."""
        # The agent's own environment where the relay tells it (a configured HOME).
        user_dir = user_gemini_dir(self.agent_environment() or os.environ)
        settings = merged_settings(user_dir / SETTINGS_FILE)
        own = private.mkdir(GEMINI_DIR)
        if user_dir.is_dir():
            for entry in sorted(user_dir.iterdir()):
                if entry.name not in (SETTINGS_FILE, APPEND_FILE):
                    private.link(f"{GEMINI_DIR}/{entry.name}", entry)
        private.write(f"{GEMINI_DIR}/{SETTINGS_FILE}", json.dumps(settings, indent=2))
        return own.parent


def check_not_blank(prompt: SystemPrompt) -> None:
    if not prompt.text.strip():
        # An empty context file adds nothing, an empty GEMINI_SYSTEM_MD gives the model
        # no instructions at all: neither is what the client asked for.
        raise PromptRefused(
            "gemini trims the system prompt, and this one is only whitespace.",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        )
