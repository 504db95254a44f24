"""Where the user's configuration file lives: standard library only, so the early start
(:mod:`acp_bridge.commands.launch`) can tell whether there is one before anything heavy is
imported, and :mod:`acp_bridge.settings` reads the same file."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # no ``typing`` at run time: see acp_bridge.commands.launch
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

USER_FILE_NAME: Final = "config.yaml"


def default_config_file(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_CONFIG_HOME/acp-bridge/config.yaml``, falling back to ``~/.config``."""
    env = os.environ if environ is None else environ
    config_home = env.get("XDG_CONFIG_HOME", "")
    if os.path.isabs(config_home):  # XDG: relative values are invalid and ignored
        return os.path.join(config_home, "acp-bridge", USER_FILE_NAME)
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".config", "acp-bridge", USER_FILE_NAME)
