"""The bridge's own stdin and stdout, for the commands that speak ACP on them (run, connect).

Only ACP frames may reach the client through stdout: :func:`claim_stdout` keeps the real
stdout for them and points fd 1 at stderr, so a stray print from any library (or a user's
adapter at import time) cannot corrupt the stream.
"""

from __future__ import annotations

import os
import sys


def claim_stdout() -> int:
    """Reserve the real stdout for ACP; anything else written to fd 1 goes to stderr.

    Returns the file descriptor the frames are to be written to.
    """
    sys.stdout.flush()
    acp_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return acp_fd
