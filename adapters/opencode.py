"""``opencode``: one ``opencode acp`` process per distinct system prompt, set through a
private configuration file.

opencode takes instructions only from its configuration, read once per process (and
cached per working directory): nothing in an ACP session carries a prompt. So this
adapter is a :class:`~acp_bridge.pool.PoolAdapter` and each prompt's process is started
with ``OPENCODE_CONFIG=<private opencode.json>``, a layer opencode merges over the user's
global configuration (measured on 1.18.33):

* ``append``: the text in a private file named in ``instructions``; opencode adds it to
  the system message as ``Instructions from: <path>`` and the text, verbatim;
* ``override``: the text as the ``prompt`` of opencode's two primary agents, ``build``
  and ``plan`` (the modes the client sees). An agent's prompt replaces opencode's own
  base prompt; opencode still adds its environment block, the user's instruction files
  and its skills list after it. The modes stay exactly those opencode offers.

The configuration is JSON text that opencode runs ``{env:NAME}`` / ``{file:PATH}``
substitution over before parsing, so every ``{`` inside a string is written as the JSON
escape ``\\u007b``: the text reaches the model as sent (``{file:…}`` would trim it, agent
markdown files are trimmed too).

Sessions live in opencode's database under the user's data directory, shared by every
process; a session records only its agent's name, and the prompt comes from the process
that serves it. So ``session/load`` / ``session/resume`` in the process of the prompt the
session should run with (the stored one under ``on_omitted: keep``) gets exactly that
prompt, after a bridge restart too, and a changed prompt applies in full.

opencode reads ``OPENCODE_CONFIG`` only when the first session in a folder starts (a file
written after ``initialize`` reaches the model, ``tests/e2e/test_opencode.py``), so the
pool keeps a spare process, named a configuration file that does not exist yet, and
writes the file when the next new prompt claims it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, write_prompt_file
from acp_bridge.wire.jsonrpc import INVALID_PARAMS, JsonObject

AGENT_NAME: Final = "OpenCode"
CONFIG_VARIABLE: Final = "OPENCODE_CONFIG"
CONFIG_FILE: Final = "opencode.json"
INSTRUCTIONS_FILE: Final = "system-prompt.md"
# opencode's built-in primary agents: the modes a client sees (session/new configOptions).
PRIMARY_AGENTS: Final = ("build", "plan")


def config_json(value: Any) -> str:
    """``value`` as JSON text that survives opencode's substitution unchanged.

    opencode replaces ``{env:…}`` and ``{file:…}`` anywhere in the configuration text
    before parsing it; a string whose every ``{`` is the escape ``\\u007b`` parses back to
    the same text and gives those patterns nothing to match. Non-ASCII characters are
    escaped as well, so text with a lone surrogate is still a valid file.
    """
    if isinstance(value, Mapping):
        items = (f"{config_json(str(k))}:{config_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ",".join(config_json(v) for v in value) + "]"
    return json.dumps(value).replace("{", "\\u007b")


def prompt_config(prompt: SystemPrompt, instructions_file: str | None) -> JsonObject:
    """The configuration layer that gives one process ``prompt``."""
    if prompt.mode == "append":
        return {"instructions": [instructions_file]}
    return {"agent": {name: {"prompt": prompt.text} for name in PRIMARY_AGENTS}}


class OpencodeAdapter(PoolAdapter):
    name = "opencode"
    description = "opencode acp: one process per distinct prompt, set in a private config file"
    agent_label = "opencode"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"append", "override"})

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        self.refuse_if_set(CONFIG_VARIABLE, "opencode's global config file")
        return ProcessConfig(env={CONFIG_VARIABLE: str(private.path / CONFIG_FILE)})

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        if prompt.mode == "override" and not prompt.text:
            # opencode treats an empty agent prompt as none and uses its own.
            raise PromptRefused(
                "opencode cannot take an empty override system prompt.",
                {"field": "systemPrompt.content"},
                INVALID_PARAMS,
            )
        instructions = None
        if prompt.mode == "append":
            path = write_prompt_file(
                private, INSTRUCTIONS_FILE, prompt.text, prompt.mode, "opencode"
            )
            instructions = str(path)
        private.write(CONFIG_FILE, config_json(prompt_config(prompt, instructions)))
