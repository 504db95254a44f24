"""The client's ``initialize``, answered before the runtime has loaded.

An editor waits for the answer to its ``initialize`` before it does anything else. When
:mod:`acp_bridge.commands.launch` has started the agent early and the answer cannot depend
on anything only the full bridge knows (no configuration file, a built-in adapter), the
exchange is done here, with the standard library and the light protocol modules
(``jsonrpc``, ``capabilities``, ``adapter`` and the chosen adapter's module): the client's
first line is read and, if it is an ``initialize`` request, written to the agent; the
agent's answer is read, the adapter is chosen from it by the table of agent names
(:func:`acp_bridge.builtin_adapters.choose`, which imports no adapter), and the client's
answer is computed with the same code the runtime uses
(:func:`acp_bridge.core.capabilities.initialize_answer`) and written. Should the agent not
answer within :data:`LOAD_AFTER` (30 ms), a thread loads the runtime (trio, click, pydantic,
yaml) meanwhile, so those imports overlap the agent's own start-up; an agent that answers
sooner is answered by a main thread that has the interpreter to itself. Whichever comes
first ends the wait: the agent's answer (an agent that starts fast gets its answer written
at once), or the runtime loaded (an agent that starts slowly, like claude-agent-acp, is then
answered by the runtime as it always was, which is by then ready for the client's next
request).

Nothing here decides anything the runtime would not: the exchange is a *prefix* of the
connection, recorded as bytes (:class:`Exchange`). The runtime replays it through its
usual path (:mod:`acp_bridge.runtime.handover`): what was read is fed to its pumps again, and
what was already written is checked to be exactly what the runtime writes, and not
written twice. So the router, the adapter and the trace see the ``initialize`` as always.

The exchange stops at the first thing it does not handle, and leaves the rest to the
runtime: a first line that is not an ``initialize`` request (or not valid), anything the
client sends before the answer, anything the agent writes before its answer, an end of
either stream, a line over :data:`LINE_LIMIT`, anything the agent writes in the same read
as its answer, the runtime loaded before the agent answered, or any failure while
computing the answer.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NoReturn

from acp_bridge import builtin_adapters
from acp_bridge.core import capabilities
from acp_bridge.runtime.adapter_context import LentContext
from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import FrameError, JsonObject, Kind

if TYPE_CHECKING:
    from acp_bridge.adapter import Adapter

# A first line (the client's, or the agent's answer) longer than this is left to the
# runtime, which applies the configured line limit to it. Real ``initialize`` lines are
# well under a kilobyte.
LINE_LIMIT: Final = 1 << 20
READ_SIZE: Final = 1 << 16
# How long the thread that loads the runtime may hold the interpreter while the exchange
# waits to read or write: short, so the answer is not held up by an import in progress.
SWITCH_INTERVAL: Final = 0.0005
# How long the agent may take to answer before the runtime is loaded in a thread while it
# starts (:class:`_Loader`). Loading takes some 150 ms of CPU.
LOAD_AFTER: Final = 0.03
# What the thread loads while the agent starts: what the run command imports first.
RUNTIME_MODULES: Final = (
    "acp_bridge.commands.cli",
    "acp_bridge.settings",
    "acp_bridge.runtime.relay",
    "acp_bridge.state.lifecycle",
    "acp_bridge.runtime.trace",
)
AUTO: Final = builtin_adapters.AUTO


class Exchange(NamedTuple):
    """What the exchange read and wrote, for the runtime to replay in this order:

    ``client_first`` (the client's first line, or all it read), then ``agent_first`` once
    ``to_agent`` has been written again, then ``client_rest`` and ``agent_rest`` once
    ``to_client`` has been written again. ``to_agent`` and ``to_client`` were already
    written: the runtime's first writes to the agent and to the client must be exactly
    these bytes, and are not written a second time.
    """

    client_first: bytes = b""
    client_rest: bytes = b""
    to_agent: bytes = b""
    agent_first: bytes = b""
    agent_rest: bytes = b""
    to_client: bytes = b""

    @property
    def answered(self) -> bool:
        """Whether the client has its answer already."""
        return bool(self.to_client)

    @property
    def stage(self) -> str:
        """How far it went: ``answered``, ``forwarded`` (to the agent) or ``read``."""
        if self.to_client:
            return "answered"
        return "forwarded" if self.to_agent else "read"


class _NotYet(Exception):
    """An adapter asked for an agent process while the answer was computed."""


def _not_yet(*_args: Any) -> NoReturn:
    raise _NotYet


class _NoAgents:
    """The agent processes as the early answer lends them: none yet. The agent started
    early is the runtime's to adopt; an adapter asking for it, or for another, fails, and
    the exchange leaves the answer to the runtime (the ``Lender`` of
    :mod:`~acp_bridge.runtime.adapter_context`)."""

    env: Mapping[str, str] = {}
    links: Mapping[int, Any] = {}

    @property
    def primary(self) -> Any:
        raise _NotYet

    async def spawn(
        self,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        private_files: Sequence[str] = (),
    ) -> Any:
        raise _NotYet

    async def stop(self, link: Any) -> None:
        raise _NotYet


def early_context() -> LentContext:
    """What an adapter is lent while its delivery is asked: the runtime's own context over
    no process yet, no live session and no options (the exchange runs only without a
    configuration file). The adapter made with it only says what it delivers and
    advertises; the runtime makes its own with the real connection."""
    return LentContext(
        _NoAgents(),
        live=tuple,
        place=_not_yet,
        unplace=_not_yet,
        start_soon=_not_yet,
        adapter_options={},
        log=_LoggerOnUse(),  # type: ignore[arg-type]
    )


class _LoggerOnUse:
    """A logger by name, imported only should the adapter log while it answers (making
    its own child logger is not logging): :mod:`logging`, with traceback, linecache,
    tokenize and string, is the largest import the answer would otherwise make."""

    def __init__(self, name: str = "acp_bridge") -> None:
        self.name = name

    def getChild(self, suffix: str) -> _LoggerOnUse:  # logging.Logger spells it so
        return _LoggerOnUse(f"{self.name}.{suffix}")

    def __getattr__(self, attribute: str) -> Any:
        import logging

        return getattr(logging.getLogger(self.name), attribute)


class _Loader:
    """Loads the runtime's modules in a thread while the exchange waits for the agent.

    Started only once the agent has not answered for :data:`LOAD_AFTER` (:meth:`start`):
    an agent that answers at once gets its answer from a main thread that shares the
    interpreter with nobody, and one that starts slowly (seconds, for most real agents)
    has the runtime loaded meanwhile all the same.
    """

    def __init__(self) -> None:
        # Readable once everything is loaded, so the exchange can wait for it with select.
        self.loaded, self._done = os.pipe()
        self._thread = threading.Thread(target=self._load, name="acp-bridge-load", daemon=True)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._thread.start()

    def _load(self) -> None:
        # A failure here is not reported: the main thread imports the same again, and
        # fails the usual way.
        with contextlib.suppress(Exception):
            for name in RUNTIME_MODULES:
                importlib.import_module(name)
        os.write(self._done, b".")

    def join(self) -> None:
        """Wait until it is done. Should it have failed, the runtime imports again and
        reports the failure the usual way."""
        if self.started:
            self._thread.join()
        os.close(self.loaded)
        os.close(self._done)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_SIZE)
    except OSError:
        return b""  # what the runtime's pumps make of a failed read


def _write_all(fd: int, data: bytes) -> int:
    """Write ``data``; how many bytes were written (fewer: the reader is gone)."""
    done = 0
    with contextlib.suppress(OSError):
        while done < len(data):
            done += os.write(fd, data[done:])
    return done


def _first_line(data: bytes) -> bytes | None:
    """The first complete line of ``data`` with its terminator, if there is one."""
    end = data.find(b"\n")
    return None if end < 0 else data[: end + 1]


def _frame(line: bytes) -> jsonrpc.Frame | None:
    """``line`` (with its terminator) as the runtime's framing and parser see it."""
    data = line[:-1]
    if data.endswith(b"\r"):
        data = data[:-1]
    try:
        return jsonrpc.parse(data)
    except FrameError:
        return None


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP end the bridge with 128 + N while it waits here, so the agent
    started early is stopped on the way out (the default action would leave it running);
    SIGINT already raises KeyboardInterrupt."""

    def stop(signum: int, _frame: object) -> NoReturn:
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Ends(NamedTuple):
    """The file descriptors of the exchange and what the answer depends on."""

    client_in: int
    client_out: int
    agent_in: int
    agent_out: int
    adapter: str
    allow_override: bool


def exchange(
    client_in: int,
    client_out: int,
    agent_in: int,
    agent_out: int,
    *,
    adapter: str = AUTO,
    allow_override: bool = True,
) -> Exchange:
    """Do the ``initialize`` exchange as far as it can be done here; see the module.

    ``adapter`` is ``auto`` or the name of a built-in adapter (the caller has checked
    that one exists under that name).
    """
    ends = _Ends(client_in, client_out, agent_in, agent_out, adapter, allow_override)
    with _signals_exit():
        interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        try:
            return _exchange(ends)
        finally:
            sys.setswitchinterval(interval)


def _exchange(ends: _Ends) -> Exchange:
    read = b""
    while (line := _first_line(read)) is None:
        data = _read(ends.client_in)
        read += data
        if not data or len(read) > LINE_LIMIT:
            return Exchange(client_first=read)
    request = _frame(line)
    if (
        request is None
        or request.kind is not Kind.REQUEST
        or request.method != "initialize"
        or request.id is None  # legal, but unusual enough to leave to the runtime
    ):
        return Exchange(client_first=read)
    client_rest = read[len(line) :]
    # What the runtime writes for an unchanged request: its bytes without the terminator.
    forward = request.raw + b"\n"
    written = _write_all(ends.agent_in, forward)
    if written < len(forward) or client_rest:
        return Exchange(client_first=line, client_rest=client_rest, to_agent=forward[:written])
    sent = Exchange(client_first=line, to_agent=forward)
    chosen: type[Adapter] | None = None
    try:
        # Now, while the agent starts: for ``auto`` only the chosen adapter's own module
        # is left to import once the agent has answered.
        from acp_bridge import registry

        if ends.adapter != AUTO:
            chosen = registry.builtin(ends.adapter)
    except Exception:  # the runtime reports it
        return sent
    loader = _Loader()
    try:
        return _answer(ends, request, sent, chosen, loader)
    finally:
        loader.join()


def _answer(
    ends: _Ends,
    request: jsonrpc.Frame,
    sent: Exchange,
    chosen: type[Adapter] | None,
    loader: _Loader,
) -> Exchange:
    """Wait for the agent's answer and give the client its own; ``sent``: so far."""
    agent_read = b""
    while (answer_line := _first_line(agent_read)) is None:
        if loader.started:
            ready, _, _ = select.select([ends.client_in, ends.agent_out, loader.loaded], [], [])
        else:
            ready, _, _ = select.select([ends.client_in, ends.agent_out], [], [], LOAD_AFTER)
            if not ready:
                loader.start()
                continue
        if loader.loaded in ready and ends.agent_out not in ready:
            # The runtime is loaded and the agent still starts: the runtime can wait for
            # the answer as well as this can, and be ready for what the client sends next.
            return sent._replace(agent_first=agent_read)
        if ends.client_in in ready:
            # Whatever the client says now (more frames, or its EOF) is the runtime's to
            # handle, in the order the usual path would.
            more = _read(ends.client_in)
            return sent._replace(client_rest=more, agent_first=agent_read)
        data = _read(ends.agent_out)
        agent_read += data
        if not data or len(agent_read) > LINE_LIMIT:
            return sent._replace(agent_first=agent_read)
    unanswered = sent._replace(agent_first=agent_read)
    if len(agent_read) > len(answer_line):
        # More came with the answer: the runtime answers, and holds what came after the
        # agent's answer until its own is sent; the exchange handles a lone answer only.
        return unanswered
    response = _frame(answer_line)
    if response is None or response.kind is not Kind.RESPONSE or response.id != request.id:
        return unanswered
    try:
        answer = _client_answer(request, response, chosen, ends.allow_override) + b"\n"
    except Exception:
        return unanswered  # the runtime computes it again, and reports what failed
    written = _write_all(ends.client_out, answer)
    return sent._replace(agent_first=answer_line, to_client=answer[:written])


def _client_answer(
    request: jsonrpc.Frame,
    response: jsonrpc.Frame,
    chosen: type[Adapter] | None,
    allow_override: bool,
) -> bytes:
    """What ``Interceptions._initialize`` answers for this response, as bytes without newline."""
    message = response.message
    result = message.get("result")
    if message.get("error") is not None or not isinstance(result, dict):
        return response.raw
    if chosen is None:
        # The table of agent names decides, as AdapterRegistry.choose does without a
        # user's adapters (no configuration file here): only the chosen one is imported.
        from acp_bridge import registry

        advertises = capabilities.native_delivery(result) is not None
        chosen = registry.builtin(
            builtin_adapters.choose(capabilities.agent_name(result), advertises)
        )
    adapter = chosen(early_context())
    _, advertised = capabilities.initialize_answer(adapter, result, allow_override=allow_override)
    if advertised is None:
        return response.raw
    reply: JsonObject = jsonrpc.result_response(request.id, advertised)
    return jsonrpc.encode(reply)
