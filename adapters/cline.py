"""``cline``: one ``cline --acp`` process per distinct system prompt, the prompt in a rules
file of a private cline folder.

cline (npm ``cline``, measured on 3.0.65) ignores ``systemPrompt`` and every ``_meta`` form,
and ``-s/--system`` does nothing in ``--acp`` mode. It builds its system message from its
folder (``CLINE_DIR``, by default ``~/.cline``) when a process starts: every file of
``<CLINE_DIR>/rules/`` goes under a closing ``# Rules`` section as ``## <file stem>`` and
the file's text. So this adapter is a :class:`~acp_bridge.pool.PoolAdapter` offering
``append`` only (no route replaces cline's own prompt); each prompt's process gets

* ``CLINE_DIR=<private folder>``: its ``rules/`` holds copies of the user's own rule files
  (cline skips symbolic links there, and reads no sub-folder) and the bridge's
  ``acp-bridge-system-prompt.md``; every other entry of the user's folder (hooks, skills,
  agents, …) is linked in, so cline behaves as it does for the user;
* ``CLINE_DATA_DIR=<the user's data folder>``: settings, provider keys and sessions stay
  the user's own, shared by every process. cline writes its sessions index there through
  one temporary file name, so turns at once in two processes (two prompts) can fail in
  cline itself: ``-32603`` with ``ENOENT`` on renaming ``sessions.index.json.tmp`` (seen
  once in four runs of the end-to-end tests, which now take their turns one at a time);
* ``CLINE_SESSION_BACKEND_MODE=local``: without it the first session starts cline's hub
  daemon (``cline --cline-hub-daemon``, its own process session, port 25463 for the whole
  machine), which outlives the process that started it and is shared by every cline of
  the machine. In local mode no hub is started or used. The primary process is started
  before the adapter is chosen, with the user's environment: the ``cline`` preset sets
  the variable for it, and the adapter warns when it is missing.

What cline does to the text: it trims each rule file (leading and trailing whitespace) and
leaves out an empty one; ``${…}``, ``{{…}}``, ``$&`` and ``@x`` reach the model as
written. cline orders rule files by name, case-insensitively, so a user's own rule named
after ``acp-bridge-system-prompt`` comes after the bridge's text.

A session stores no prompt: the system message is rebuilt from the serving process's
folder on every turn, so ``session/load`` in the process of the prompt the session should
run with gets exactly that prompt, after a bridge restart too. cline has no
``session/resume``, ``fork``, ``close`` or ``list``. As it reads its rules only when a
session starts (a rule file written after ``initialize`` reaches the model,
``tests/e2e/test_cline.py``), the pool can keep a spare process whose private folder holds
all but the bridge's rule file, written when the process is claimed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from acp_bridge.adapter import AdapterContext
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.pool import PoolAdapter, PrivateDir, ProcessConfig, PromptRefused, write_prompt_file
from acp_bridge.wire.jsonrpc import INVALID_PARAMS

AGENT_NAME: Final = "cline"
RULES: Final = "rules"
DATA: Final = "data"
RULE_FILE: Final = "acp-bridge-system-prompt.md"
# Without it cline starts (or joins) its machine-wide hub daemon; see the module docstring.
LOCAL_BACKEND: Final = {"CLINE_SESSION_BACKEND_MODE": "local"}


def user_cline_dir(environ: Mapping[str, str]) -> Path:
    """The user's own cline folder, as cline finds it."""
    own = environ.get("CLINE_DIR", "").strip()
    if own:
        return Path(own)
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cline"


def user_data_dir(environ: Mapping[str, str]) -> Path:
    """The user's own cline data folder (settings, providers, sessions)."""
    own = environ.get("CLINE_DATA_DIR", "").strip()
    return Path(own) if own else user_cline_dir(environ) / DATA


def private_cline_dir(user_dir: Path, private: PrivateDir) -> Path:
    """A cline folder in ``private``: the user's folder, ready for the bridge's rule."""
    if user_dir.is_dir():
        for entry in sorted(user_dir.iterdir()):
            if entry.name != RULES:
                private.link(entry.name, entry)
    rules = private.mkdir(RULES)
    user_rules = user_dir / RULES
    if user_rules.is_dir():
        for rule in sorted(user_rules.iterdir()):
            if rule.name != RULE_FILE and rule.is_file():
                shutil.copyfile(rule, rules / rule.name)  # a link would be skipped
                (rules / rule.name).chmod(0o600)
    return private.path


class ClineAdapter(PoolAdapter):
    name = "cline"
    description = "cline --acp: one process per distinct prompt, a rules file (append only)"
    agent_label = "cline"
    reported_name = AGENT_NAME
    spare_modes = frozenset({"append"})
    append_only = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        # The primary was started before the adapter was chosen, with the user's settings.
        environment = self.agent_environment() or os.environ
        if environment.get("CLINE_SESSION_BACKEND_MODE", "").strip().lower() != "local":
            self.log.warning(
                "cline runs without CLINE_SESSION_BACKEND_MODE=local: a session in it starts "
                "cline's hub daemon, which outlives the bridge (the cline preset sets it)"
            )

    def fill_spare(self, prompt: SystemPrompt, private: PrivateDir) -> None:
        check_not_blank(prompt)
        write_prompt_file(private, f"{RULES}/{RULE_FILE}", prompt.text, prompt.mode, "cline")

    def spare_config(self, mode: str, private: PrivateDir) -> ProcessConfig:
        environment = self.agent_environment() or os.environ
        try:
            folder = private_cline_dir(user_cline_dir(environment), private)
        except OSError as exc:
            raise PromptRefused(
                f"The bridge cannot carry the user's cline folder over to a private one: {exc}"
            ) from exc
        env = {
            "CLINE_DIR": str(folder),
            "CLINE_DATA_DIR": str(user_data_dir(environment)),
            **LOCAL_BACKEND,
        }
        return ProcessConfig(env=env)


def check_not_blank(prompt: SystemPrompt) -> None:
    if not prompt.text.strip():
        # cline trims a rule file and leaves an empty one out: nothing would arrive.
        raise PromptRefused(
            "cline trims the system prompt, and this one is only whitespace.",
            {"field": "systemPrompt.content"},
            INVALID_PARAMS,
        )
