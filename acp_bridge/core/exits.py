"""How the bridge words the end of an agent process, for the client and the log.

Sans-IO and dependency-free: the router (answers to requests the process left unanswered)
and the adapter interface (:class:`acp_bridge.adapter.AgentExited`) both use it, and the
adapter interface is on the way to the early ``initialize`` answer, which should not load
the router.
"""

from __future__ import annotations


def describe_exit(status: int | None) -> str:
    """``status``: the process's return code (negative: killed by that signal), or None."""
    if status is None:
        return "The agent exited."
    if status < 0:
        return f"The agent was killed by signal {-status}."
    return f"The agent exited with status {status}."
