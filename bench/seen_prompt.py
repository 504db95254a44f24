"""What the bridge itself spends on a ``session/new`` with a prompt whose process runs.

    python bench/seen_prompt.py [--calls 2000] [--rounds 3] [--adapter gemini codex ...]
        [--notes N] [--note-bytes N] [--prompt-bytes N] [--state-file] [--before CHECKOUT]
        [--verbose]
    python bench/seen_prompt.py --profile FILE [--top 25] [--adapter ...]

``pool_bench.py`` measures this call against the real agents, whose own ``session/new``
(3-100 ms) and its swings under load hide what the bridge adds. Here the agent is a stand-in
that answers at once (this file run with ``agent``: stdlib only, a ``session/new`` answer
shaped like the real agents' with modes and models, ``--notes`` notifications after it as
qwen-code sends its commands; ``--note-bytes``: each padded to that size with a skill's
text in ``_meta``, as qwen-code 0.24.4 sends them, about 570 KB with its bundled skills),
so what remains is the bridge:

* **bridge CPU per call**: CPU time of the bridge process (all threads; the process's
  CPU-time clock) over ``--calls`` seen-prompt ``session/new`` calls, divided by their
  number, counted after 50 such calls (the first calls after a process starts cost more).
  It hardly depends on the machine's load;
* **call**: the median wall time of one ``session/new``, through the bridge and to the
  stand-in alone (**direct**: the same stand-in, the same client); **added**: bridge minus
  direct in the same round. The paths are interleaved, their order turning each round.

The bridge runs as ``pool_bench.py`` runs it: ``python -m acp_bridge --state :memory:
--log-level error --adapter NAME -- <stand-in>`` (``--state-file``: a database file, as a
user's default is), after ``initialize``, a session without a prompt and one with the
prompt (which starts its process). ``--prompt-bytes``: the prompt's text padded to that
size. ``--before CHECKOUT``: the bridge of another checkout (a ``git worktree`` of an
older commit, put first on ``PYTHONPATH``) measured as a third path in the same rounds.

``--profile FILE``: the bridge runs under cProfile (CPU time of the main thread), switched
on (SIGUSR1) just before the seen calls and off (SIGUSR2) just after, so the profile holds
those calls only; the top functions are printed per call (own and cumulative time in
microseconds; the profiler itself makes Python calls about three times as dear).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_bench
from peer_bench import cpu_seconds, new_params

# What the stand-in says it is, per adapter: the initialize answer the adapter expects.
AGENT_INFO: Final = {
    "gemini": {"name": "gemini-cli", "version": "0.61.0"},
    "qwen": {"name": "qwen-code", "version": "0.2.0"},
    "codex": {"name": "codex-acp", "version": "0.16.0"},
    "opencode": {"name": "OpenCode", "version": "1.18.33"},
    "copilot": {"name": "copilot", "version": "1.0.0"},
    "cline": {"name": "cline", "version": "3.0.65"},
    "kilo": {"name": "kilo", "version": "7.7.9"},
}
WARMUP: Final = 50

# Run by cProfile's side: switch profiling on and off by signal, dump the stats on the way.
PROFILED_BRIDGE: Final = """
import cProfile, runpy, signal, sys
path = sys.argv[1]
import time
profile = cProfile.Profile(time.thread_time)
def start(*_):
    profile.enable()
def stop(*_):
    profile.disable()
    profile.dump_stats(path)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.argv = ["acp_bridge", *sys.argv[2:]]
runpy.run_module("acp_bridge", run_name="__main__", alter_sys=True)
"""


# ------------------------------------------------------------------ the stand-in


def session_new_result(session_id: str) -> dict[str, Any]:
    """A ``session/new`` answer shaped like gemini-cli's and qwen-code's: modes and models."""
    modes = [
        {"id": "default", "name": "Default", "description": "Ask before editing files"},
        {"id": "autoEdit", "name": "Auto Edit", "description": "Edit files without asking"},
        {"id": "yolo", "name": "YOLO", "description": "Run every tool without asking"},
    ]
    models = [
        {"modelId": f"model-{n}", "name": f"Model {n}", "description": "A model " * 6}
        for n in range(4)
    ]
    return {
        "sessionId": session_id,
        "modes": {"currentModeId": "default", "availableModes": modes},
        "models": {"currentModelId": "model-0", "availableModels": models},
    }


# A line of a skill's text as qwen-code sends it in _meta.availableSkillDetails (markdown).
SKILL_LINE: Final = '- Run `tool --flag "value"` when the user asks; see "Steps" below.\n'


def commands_note(session_id: str, size: int = 0) -> bytes:
    """An ``available_commands_update`` as qwen-code sends after ``session/new`` (~4 KB),
    padded to about ``size`` bytes with a skill's text in ``_meta`` (qwen-code 0.24.4 sends
    the bodies of its skills there: ~570 KB, one of them ~400 KB)."""
    commands = [
        {"name": f"command{n}", "description": f"What command {n} does, in a sentence or two."}
        for n in range(40)
    ]
    update: dict[str, Any] = {
        "sessionUpdate": "available_commands_update",
        "availableCommands": commands,
    }
    if size:
        lines = max(0, size - 4096) // len(json.dumps(SKILL_LINE))
        skill = {"name": "skill", "description": "A bundled skill.", "body": SKILL_LINE * lines}
        update["_meta"] = {"availableSkills": ["skill"], "availableSkillDetails": [skill]}
    note = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session_id, "update": update},
    }
    return json.dumps(note).encode() + b"\n"


def run_agent(notes: int, name: str, note_bytes: int = 0) -> None:
    """The stand-in agent: answers initialize and session/new at once, anything else null."""
    out = sys.stdout.buffer
    info = AGENT_INFO.get(name, {"name": name, "version": "1"})
    initialize = {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": True, "embeddedContext": True},
            "sessionCapabilities": {"close": {}},
        },
        "authMethods": [],
        "agentInfo": info,
    }
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        method = message["method"]
        session_id = None
        if method == "initialize":
            result: Any = initialize
        elif method == "session/new":
            session_id = str(uuid.uuid4())
            result = session_new_result(session_id)
        else:
            result = None
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        data = json.dumps(answer).encode() + b"\n"
        if session_id is not None:
            data += commands_note(session_id, note_bytes) * notes
        out.write(data)
        out.flush()


# ------------------------------------------------------------------ the client


class Peer(peer_bench.Peer):
    """:class:`peer_bench.Peer`, timing ``session/new`` calls."""

    def timed_news(self, params: dict[str, Any], calls: int, notes: int) -> list[float]:
        """``calls`` session/new requests, one at a time: the wall time of each, in ms.
        Each waits for its answer and the ``notes`` notifications that follow it."""
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            result = self.request("session/new", params)
            for _ in range(notes):
                self.stdout.readline()
            times.append((time.perf_counter() - started) * 1000)
            if not isinstance(result, dict) or "sessionId" not in result:
                raise RuntimeError(f"session/new answered without a sessionId: {result!r}")
        return times


def agent_argv(adapter: str, notes: int, note_bytes: int = 0) -> list[str]:
    script = str(Path(__file__).resolve())
    return [sys.executable, script, "agent", str(notes), adapter, str(note_bytes)]


def bridge_argv(
    adapter: str,
    notes: int,
    config: Path,
    profile: Path | None,
    state: str = ":memory:",
    *,
    note_bytes: int = 0,
) -> list[str]:
    arguments = ["--state", state, "--log-level", "error", "--config", str(config)]
    arguments += ["--adapter", adapter, "--", *agent_argv(adapter, notes, note_bytes)]
    if profile is None:
        return [sys.executable, "-m", "acp_bridge", *arguments]
    return [sys.executable, "-c", PROFILED_BRIDGE, str(profile), *arguments]


def direct(adapter: str, notes: int, calls: int, cwd: Path, note_bytes: int = 0) -> list[float]:
    peer = Peer(agent_argv(adapter, notes, note_bytes), dict(os.environ), cwd)
    try:
        peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        peer.timed_news(new_params(cwd), WARMUP, notes)
        return peer.timed_news(new_params(cwd), calls, notes)
    finally:
        peer.close(30.0)


def bridged(
    adapter: str,
    notes: int,
    calls: int,
    cwd: Path,
    *,
    profile: Path | None = None,
    warmup: int = WARMUP,
    source: Path | None = None,
    prompt_bytes: int = 0,
    state_file: bool = False,
    note_bytes: int = 0,
) -> tuple[list[float], float]:
    """Wall times of ``calls`` seen-prompt session/new calls, and the bridge's CPU per call
    (ms); ``source``: a checkout whose ``acp_bridge`` runs instead of the installed one."""
    config = cwd / "bridge.yaml"
    config.write_text(
        f"bridge:\n  adapter_options:\n    {adapter}: {{max_processes: 4, spare: false}}\n"
    )
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    state = ":memory:"
    if state_file:
        state = str(cwd / f"sessions-{uuid.uuid4()}.sqlite3")
    argv = bridge_argv(adapter, notes, config, profile, state, note_bytes=note_bytes)
    peer = Peer(argv, env, cwd)
    mode = "append"
    try:
        peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        peer.timed_news(new_params(cwd), 1, notes)
        text = f"seen prompt bench {uuid.uuid4()} "
        params = new_params(cwd, text + "x" * max(0, prompt_bytes - len(text)), mode)
        peer.timed_news(params, 1 + warmup, notes)  # the first starts the prompt's process
        if profile is not None:
            os.kill(peer.process.pid, signal.SIGUSR1)
        before = cpu_seconds(peer.process.pid)
        times = peer.timed_news(params, calls, notes)
        cpu = (cpu_seconds(peer.process.pid) - before) / calls * 1000
        if profile is not None:
            os.kill(peer.process.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not profile.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the dump may still be being written
    finally:
        peer.close(30.0)
    return times, cpu


def print_profile(path: Path, calls: int, top: int) -> None:
    import pstats

    stats = pstats.Stats(str(path))
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows: list[tuple[float, float, int, str]] = []
    for (filename, line, function), (_, ncalls, own, cumulative, _) in entries.items():
        short = filename
        for marker in ("acp_bridge/", "adapters/", "site-packages/", "lib/python3"):
            if marker in filename:
                short = filename[filename.index(marker) :]
                break
        rows.append((own, cumulative, ncalls, f"{short}:{line}({function})"))
    total = sum(row[0] for row in rows)
    functions = sum(row[2] for row in rows)
    print(
        f"profile: {total / calls * 1e6:.0f} us of profiled time and {functions / calls:.0f} "
        "Python function calls per call (that count does not depend on the load)"
    )
    for title, key in (("own time", 0), ("cumulative time", 1)):
        print(f"top {top} by {title}, per call: own us, cumulative us, calls per call")
        ordered = sorted(rows, key=lambda row: row[0] if key == 0 else row[1], reverse=True)
        for own, cumulative, ncalls, name in ordered[:top]:
            print(
                f"  {own / calls * 1e6:8.1f} {cumulative / calls * 1e6:8.1f} "
                f"{ncalls / calls:6.2f}  {name}"
            )


def main(argv: Sequence[str] | None = None) -> None:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["agent"]:
        run_agent(int(arguments[1]), arguments[2], int(arguments[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adapter", nargs="+", default=["gemini", "codex"])
    parser.add_argument("--notes", type=int, default=0, help="notifications after each answer")
    parser.add_argument(
        "--note-bytes", type=int, default=0, help="pad each notification to this (qwen: 570000)"
    )
    parser.add_argument("--profile", type=Path, help="cProfile the bridge into this file")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--before", type=Path, help="a checkout of another commit, measured interleaved"
    )
    parser.add_argument("--prompt-bytes", type=int, default=0, help="pad the prompt to this")
    parser.add_argument(
        "--state-file", action="store_true", help="a session database file, not :memory:"
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(arguments)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="seen-prompt-") as folder:
        cwd = Path(folder)
        if args.profile is not None:
            for adapter in args.adapter:
                path = args.profile.with_suffix(f".{adapter}.prof")
                path.unlink(missing_ok=True)
                _, profiled_cpu = bridged(
                    adapter,
                    args.notes,
                    args.calls,
                    cwd,
                    profile=path,
                    prompt_bytes=args.prompt_bytes,
                    state_file=args.state_file,
                    note_bytes=args.note_bytes,
                )
                print(f"{adapter}: bridge CPU per call under the profiler {profiled_cpu:.3f} ms")
                print_profile(path, args.calls, args.top)
            return
        paths = ["direct", "bridge", *(["before"] if args.before is not None else [])]
        results: dict[tuple[str, str], dict[str, list[float]]] = {}
        for round_number in range(args.rounds):
            turn = round_number % len(paths)
            for adapter in args.adapter:
                figures: dict[str, float] = {}
                for path in paths[turn:] + paths[:turn]:
                    cpu = None
                    if path == "direct":
                        times = direct(adapter, args.notes, args.calls, cwd, args.note_bytes)
                    else:
                        source = args.before if path == "before" else None
                        times, cpu = bridged(
                            adapter,
                            args.notes,
                            args.calls,
                            cwd,
                            source=source,
                            prompt_bytes=args.prompt_bytes,
                            state_file=args.state_file,
                            note_bytes=args.note_bytes,
                        )
                    figures[path] = statistics.median(times)
                    row = results.setdefault((adapter, path), {"cpu": [], "call": [], "added": []})
                    row["call"].append(figures[path])
                    if cpu is not None:
                        row["cpu"].append(cpu)
                for path in paths[1:]:
                    added = figures[path] - figures["direct"]
                    results[(adapter, path)]["added"].append(added)
                if args.verbose:
                    print(f"  round {round_number + 1} {adapter}: {figures}", file=sys.stderr)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.calls} calls per "
        f"path and round, {args.rounds} rounds, {args.notes} notifications per answer "
        f"({args.note_bytes or 'about 4000'} bytes each); load "
        f"(1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f},"
        f" after {'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'adapter':9} {'path':7} {'bridge CPU/call ms':22} {'call ms':22} added ms")
    for (adapter, path), row in results.items():
        print(
            f"{adapter:9} {path:7} {span(row['cpu']):22} {span(row['call']):22} "
            f"{span(row['added'])}"
        )
    print(
        "medians of the rounds [min-max]; call: the median wall time of one session/new; "
        "added: bridge - direct in the same round"
        + ("; before: the bridge from --before" if args.before is not None else "")
    )


def span(values: list[float]) -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    return f"{middle:.3f} [{min(values):.3f}-{max(values):.3f}]"


if __name__ == "__main__":
    main()
