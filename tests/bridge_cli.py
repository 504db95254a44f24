"""The bridge's command line as the end-to-end tests run it in front of a real agent, the
environment such an agent runs in, and the config ``acp-bridge verify`` gets for an agent
of the test cache."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import agents
import yaml


def bridge_command(state: str | Path, agent: Sequence[str], *bridge_args: str) -> list[str]:
    """``python -m acp_bridge --state STATE [BRIDGE_ARGS] -- AGENT...``."""
    return [sys.executable, "-m", "acp_bridge", "--state", str(state), *bridge_args, "--", *agent]


def write_verify_config(
    path: Path, agent: str, command: Sequence[str], verify_env: Mapping[str, str] | None = None
) -> Path:
    """A config that starts ``agent`` with ``command``: the cached install, where the
    shipped preset would fetch it through npx. Everything else comes from the preset."""
    entry: dict[str, Any] = {"command": command[0], "args": list(command[1:])}
    if verify_env:
        entry["verify"] = {"env": dict(verify_env)}
    path.write_text(yaml.safe_dump({"agents": {agent: entry}}))
    return path


def isolated_env(home: Path, *, without: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This machine's environment fit for an agent, less variables starting with
    ``without`` (the user's own settings of the agent), with ``home`` as ``HOME`` and
    ``extra`` on top."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(without)}
    return {**agents.clean_agent_env(base), "HOME": str(home), **extra}
