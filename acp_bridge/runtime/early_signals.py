"""SIGTERM and SIGHUP before the runtime listens for them: standard library only.

The runtime answers both with an orderly stop and the exit status 128 + N
(:meth:`acp_bridge.runtime.shutdown.Shutdown.watch_signals`), but it listens only once its
trio run is going. An agent started early (:mod:`acp_bridge.commands.launch`) runs from
well before that; a signal in between would take the operating system's default action,
the bridge would die by it, and its exit status would say so instead of 128 + N.

So from the moment an agent is about to be started early, the bridge keeps its own
handlers for both signals, in one of two modes:

* **exit** (:func:`install`): the signal raises ``SystemExit(128 + N)`` where the main
  thread is. Before the trio run that is plain start-up code (imports, the command
  line), and the exit stops the agent on the way out (``launch``'s exit hook).
* **hold** (:func:`held`, around the trio run): the signal is only recorded, since an
  exception raised inside trio's own machinery could leave it in pieces. The runtime
  takes the record (:func:`take`) once its own receiver is open, so no signal is lost
  between the two. A record nobody took ends the run's block with ``SystemExit``.
"""

from __future__ import annotations

# ``signal`` without the ``enum`` it builds to name its numbers: nothing before the
# agent's spawn imports ``enum``.
import _signal as signal  # type: ignore[import-not-found]
import contextlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _State:
    """Where the handlers stand: installed, holding, and the signal held."""

    __slots__ = ("holding", "installed", "pending")

    def __init__(self) -> None:
        self.installed = False
        self.holding = False
        self.pending: int | None = None


_STATE = _State()


def _handle(signum: int, _frame: FrameType | None) -> None:
    if _STATE.holding:
        if _STATE.pending is None:
            _STATE.pending = signum
        return
    raise SystemExit(128 + signum)


def install() -> None:
    """Handle SIGTERM and SIGHUP from now on (exit mode), where the defaults are set."""
    if _STATE.installed:
        return
    for signum in SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _handle)
    _STATE.installed = True


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Record SIGTERM and SIGHUP instead of exiting, for a block that runs trio.

    Without :func:`install` before, nothing is changed. A signal recorded in the block
    and never taken ends it with ``SystemExit(128 + N)``.
    """
    if not _STATE.installed:
        yield
        return
    _STATE.holding = True
    try:
        yield
    finally:
        _STATE.holding = False
        pending = take()
        if pending is not None:
            raise SystemExit(128 + pending)


def take() -> int | None:
    """The signal recorded while held and not taken yet (once), else None."""
    pending, _STATE.pending = _STATE.pending, None
    return pending
