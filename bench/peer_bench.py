"""acp-bridge beside its peer, the TypeScript ACP conductor, measured in one run.

    python bench/peer_bench.py [--rounds 5] [--quick] [--only FIGURE ...] [--pool]
                               [--bridge-python PYTHON]

Four ways for a client to reach the same agent, each measured in the same run, interleaved
(every figure takes one fresh process per path per round; the order of the paths turns
from round to round):

* **direct**: the agent itself;
* **bridge**: ``acp-bridge`` (the script installed beside ``python``; ``python -m
  acp_bridge`` where there is none) in front of it (the ``passthrough`` adapter for the
  echo agent, the adapter it picks itself for claude-agent-acp); ``--bridge-python`` names
  the interpreter (default: this one). An editable install (``pip install -e``) adds its
  import finder to every start of that interpreter; a user's install has none, so the
  start figures are best taken with a regular install (``pip install .`` into a venv of
  its own);
* **conductor**: ``@thinkwell/conductor@0.5.7`` made a stdio pass-through by
  ``bench/conductor_stdio.mjs`` (installed from npm into the agent cache by this script);
* **raw**: ``bench/raw_relay.py``, trio copying bytes without reading them, the floor for
  any trio relay.

The agent is ``bench/echo_agent.py``, except for the last figure: a real turn of
claude-agent-acp 0.23.1 (spawn → ``initialize`` → ``session/new`` → ``session/prompt``
answered) against the embedded model endpoint. Each figure is printed as the median of the
rounds with its range, then the ratios between the paths. Memory figures are the relay's
own process (not the agent's), read from ``/proc``: the peak while 16 MiB frames pass,
and how much it grows while the client does not read 48 MB of notifications. The "relay
CPU" rows are the CPU time the relay process (all its threads, ended ones included) spent
per unit of work after one request was answered, from the process's CPU-time clock: on a
machine shared with other work they vary far less than the wall-clock rows, which count
time spent waiting for a core.

``--pool`` also runs ``bench/pool_bench.py`` with the same number of rounds, spares on and
off: what ``session/new`` with a new prompt costs for the agents that take their prompt per
process (the conductor has no such figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

# tests/agents.py installs npm packages; the echo agent and its client live beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents
import echo_agent
import relay_bench

from acp_bridge.model_endpoint import ThreadedModelEndpoint

BENCH: Final = Path(__file__).resolve().parent
CONDUCTOR: Final = ("@thinkwell/conductor", "0.5.7")
CONDUCTOR_SCRIPT: Final = BENCH / "conductor_stdio.mjs"
ECHO_AGENT: Final = BENCH / "echo_agent.py"
RAW_RELAY: Final = BENCH / "raw_relay.py"
PATHS: Final = ("direct", "bridge", "conductor", "raw")
MiB: Final = 1024 * 1024
# What the slow reader leaves unread: enough that a relay without backpressure shows it.
SLOW_READER_BYTES: Final = 48_000_000
CLOSE_TIMEOUT: Final = 5.0


def read_status(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` memory figure (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


class Peer(relay_bench.Peer):
    """A path to the agent: the process the client talks to, started in its own group."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            bufsize=0,
            start_new_session=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout = os.fdopen(self.process.stdout.fileno(), "rb", 1 << 20, closefd=False)
        self.next_id = 0

    def initialize(self) -> None:
        answer = self.call("initialize", b'{"protocolVersion":1,"clientCapabilities":{}}')
        if b'"result"' not in answer:
            raise RuntimeError(f"initialize failed: {answer[:300]!r}")

    def request(self, method: str, params: Any) -> Any:
        """Send a request and read until its answer; notifications are skipped and the
        agent's own requests refused (a text-only turn needs none)."""
        self.next_id += 1
        own_id = self.next_id
        message = {"jsonrpc": "2.0", "id": own_id, "method": method, "params": params}
        self.stdin.write(json.dumps(message).encode() + b"\n")
        while line := self.stdout.readline():
            frame = json.loads(line)
            if "method" in frame and "id" in frame:
                error = {"code": -32601, "message": "not in this benchmark"}
                refusal = {"jsonrpc": "2.0", "id": frame["id"], "error": error}
                self.stdin.write(json.dumps(refusal).encode() + b"\n")
            elif "method" not in frame and frame.get("id") == own_id:
                if "error" in frame:
                    raise RuntimeError(f"{method} failed: {frame['error']}")
                return frame["result"]
        raise RuntimeError(f"the peer closed its output before answering {method}")

    def close(self, wait: float = CLOSE_TIMEOUT) -> None:
        try:
            self.stdin.close()
            self.process.wait(timeout=wait)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            pass
        finally:
            # The conductor does not always end on EOF; nothing may outlive a measurement.
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.stdout.close()


def new_params(cwd: Path, prompt: str | None = None, mode: str = "append") -> dict[str, Any]:
    params: dict[str, Any] = {"cwd": str(cwd), "mcpServers": []}
    if prompt is not None:
        params["systemPrompt"] = {"mode": mode, "content": [{"type": "text", "text": prompt}]}
    return params


# ------------------------------------------------------------------ figures


def start_to_initialize(peer: Peer, pid: int | None, key: str = "start") -> dict[str, float]:
    peer.initialize()
    figures = {key: (time.perf_counter() - peer.started) * 1000}
    if pid is not None:
        figures[f"{key}_cpu"] = cpu_seconds(pid) * 1000
    return figures


def cpu_seconds(pid: int | None) -> float:
    """CPU time a process has used so far, its ended threads included, in nanosecond
    resolution; 0 for none. Read from the process's CPU-time clock (Linux: clock id
    ``(~pid << 3) | 2``); where that fails, the sum of its live threads'
    ``/proc/PID/task/*/schedstat`` (``/proc/PID/stat`` counts in ticks of 10 ms).

    Ended threads matter: the bridge loads its runtime in a thread that ends soon after the
    ``initialize`` answer, and a sum over live threads drops what that thread used."""
    if pid is None:
        return 0.0
    with suppress(OSError):
        return time.clock_gettime((~pid << 3) | 2)
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def warm_up(peer: Peer) -> None:
    """One request answered before a CPU figure is taken: the bridge has then finished
    loading (it answers ``initialize`` first and loads the rest meanwhile), so what it
    costs to start is not counted as work."""
    peer.call("bench/echo", b"{}")


def relay_cpu(
    pid: int | None, measure: Callable[[], float], per: float, key: str
) -> dict[str, float]:
    """``measure()`` as figure ``key``, and the relay's CPU time per ``per`` units of work
    as ``key_cpu`` (microseconds): unlike wall time, it hardly depends on the machine's load."""
    before = cpu_seconds(pid)
    figures = {key: measure()}
    if pid is not None:
        figures[key + "_cpu"] = (cpu_seconds(pid) - before) / per * 1e6
    return figures


def round_trip(peer: Peer, count: int, pid: int | None) -> dict[str, float]:
    peer.initialize()
    warm_up(peer)
    before = cpu_seconds(pid)
    samples = sorted(relay_bench.latency(peer, count))
    figures = {"rtt50": statistics.median(samples), "rtt99": samples[int(len(samples) * 0.99)]}
    if pid is not None:
        figures["rtt_cpu"] = (cpu_seconds(pid) - before) / count * 1e6
    return figures


def notes_to_agent(peer: Peer, count: int, pid: int | None) -> dict[str, float]:
    peer.initialize()
    warm_up(peer)
    return relay_cpu(
        pid, lambda: relay_bench.notifications_to_agent(peer, count), count, "notes_c2a"
    )


def notes_to_client(peer: Peer, count: int, pid: int | None) -> dict[str, float]:
    peer.initialize()
    warm_up(peer)
    return relay_cpu(
        pid, lambda: relay_bench.notifications_to_client(peer, count), count, "notes_a2c"
    )


def frames_1mib(peer: Peer, count: int, pid: int | None) -> dict[str, float]:
    peer.initialize()
    warm_up(peer)
    # Each frame crosses twice (echoed), warm-up included.
    return relay_cpu(
        pid, lambda: relay_bench.large_frames(peer, MiB, count), 2 * (count + 1), "mib1"
    )


def frames_16mib(peer: Peer, count: int, relay_pid: int | None) -> dict[str, float]:
    peer.initialize()
    figures = {"mib16": relay_bench.large_frames(peer, 16 * MiB, count)}
    if relay_pid is not None:
        figures["rss16"] = read_status(relay_pid, "VmHWM") / 1e6
    return figures


def slow_reader(peer: Peer, stall: float, relay_pid: int | None) -> dict[str, float]:
    """The agent writes 48 MB of notifications; the client reads none of it for ``stall``
    seconds, then all of it. Growth of the relay's resident memory meanwhile, in MB."""
    peer.initialize()
    if relay_pid is None:
        return {}
    # The bridge answers initialize before it has loaded everything (the rest loads
    # meanwhile): an answered request first, so the baseline is the relay at work.
    peer.call("bench/echo", b"{}")
    count = SLOW_READER_BYTES // len(echo_agent.NOTE)
    before = read_status(relay_pid, "VmRSS")
    peer.stdin.write(peer.request_line("bench/flood", b'{"count":%d}' % count))
    peak = before
    deadline = time.perf_counter() + stall
    while time.perf_counter() < deadline:
        peak = max(peak, read_status(relay_pid, "VmRSS"))
        time.sleep(0.02)
    for _ in range(count):
        peer.stdout.readline()
    if b'"result"' not in peer.stdout.readline():
        raise RuntimeError("the flood was not answered after its notifications")
    return {"slow": (peak - before) / 1e6}


def claude_turn(peer: Peer, cwd: Path) -> dict[str, float]:
    peer.initialize()
    session = peer.request("session/new", {"cwd": str(cwd), "mcpServers": []})
    prompt = [{"type": "text", "text": "Say hello."}]
    peer.request("session/prompt", {"sessionId": session["sessionId"], "prompt": prompt})
    return {"claude": (time.perf_counter() - peer.started) * 1000}


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    digits: int = 0


FIGURES: Final = (
    Figure("start", "start -> initialize answer", "ms", False, 1),
    Figure("start_cpu", "relay CPU until the initialize answer", "ms", False, 1),
    Figure("auto", "start -> initialize answer, adapter chosen", "ms", False, 1),
    Figure("auto_cpu", "relay CPU until that answer", "ms", False, 1),
    Figure("rtt50", "round trip p50", "us", False, 1),
    Figure("rtt99", "round trip p99", "us", False, 1),
    Figure("rtt_cpu", "relay CPU per round trip", "us", False, 1),
    Figure("notes_c2a", "small notifications client->agent", "msg/s", True),
    Figure("notes_c2a_cpu", "relay CPU per notification client->agent", "us", False, 2),
    Figure("notes_a2c", "small notifications agent->client", "msg/s", True),
    Figure("notes_a2c_cpu", "relay CPU per notification agent->client", "us", False, 2),
    Figure("mib1", "1 MiB frames echoed", "MiB/s", True),
    Figure("mib1_cpu", "relay CPU per 1 MiB frame", "us", False),
    Figure("mib16", "16 MiB frames echoed", "MiB/s", True),
    Figure("rss16", "peak RSS of the relay, 16 MiB frames", "MB", False, 1),
    Figure("slow", "slow reader, 48 MB of notifications: RSS growth", "MB", False, 1),
    Figure("claude", "claude-agent-acp 0.23.1 turn, spawn -> prompt answered", "ms", False),
)


# ------------------------------------------------------------------ the run


@dataclass
class Setup:
    """How each path is started, for the echo agent and for claude-agent-acp."""

    env: dict[str, str]
    conductor_dir: Path
    claude: list[str]
    claude_env: dict[str, str]
    claude_cwd: Path
    bridge_python: str = sys.executable

    def argv(self, path: str, agent: list[str], bridge_options: Sequence[str]) -> list[str]:
        if path == "direct":
            return agent
        if path == "bridge":
            return [*bridge_command(self.bridge_python), "--state", ":memory:",
                    "--log-level", "error", *bridge_options, "--", *agent]  # fmt: skip
        if path == "conductor":
            return [shutil.which("node") or "node", "conductor_stdio.mjs", *agent]
        return [self.bridge_python, str(RAW_RELAY), *agent]


@dataclass
class Results:
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)  # 1-minute load average per round

    def add(self, path: str, figures: dict[str, float]) -> None:
        for key, value in figures.items():
            self.values.setdefault(key, {}).setdefault(path, []).append(value)

    def median(self, key: str, path: str) -> float | None:
        samples = self.values.get(key, {}).get(path)
        return statistics.median(samples) if samples else None


def install_conductor() -> Path:
    """Install the conductor into the agent cache; put the stdio script beside it."""
    where = agents.install(*CONDUCTOR)
    script = where / CONDUCTOR_SCRIPT.name
    if not script.is_file() or script.read_bytes() != CONDUCTOR_SCRIPT.read_bytes():
        # Node resolves the package from the script's own folder, so it lives there.
        shutil.copyfile(CONDUCTOR_SCRIPT, script)
    return where


@contextmanager
def claude_setup(work: Path) -> Iterator[tuple[list[str], dict[str, str], Path]]:
    command = agents.claude_agent_command(*agents.CLAUDE_LEGACY)
    (work / "home").mkdir()
    (work / "project").mkdir()
    with ThreadedModelEndpoint(reply="Hello.") as endpoint:
        env = agents.clean_agent_env(os.environ)
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            env.pop(name, None)
        env.update(
            HOME=str(work / "home"),
            ANTHROPIC_BASE_URL=endpoint.url,
            ANTHROPIC_API_KEY="sk-ant-acp-bridge-bench",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        yield command, env, work / "project"


Measure = Callable[[Peer, "int | None"], dict[str, float]]


def measure(
    setup: Setup, path: str, job: Measure, *, claude: bool = False, auto: bool = False
) -> dict[str, float]:
    if claude:
        argv = setup.argv(path, setup.claude, [])
        env = setup.claude_env
    else:
        # auto: the default command line, the adapter chosen from the initialize answer.
        options = [] if auto else ["--adapter", "passthrough"]
        argv = setup.argv(path, [sys.executable, str(ECHO_AGENT)], options)
        env = setup.env
    cwd = setup.conductor_dir if path == "conductor" else None
    peer = Peer(argv, env, cwd)
    try:
        return job(peer, None if path == "direct" else peer.process.pid)
    finally:
        # claude-agent-acp takes seconds to end on EOF, after the figure was taken.
        peer.close(0.0 if claude else CLOSE_TIMEOUT)


def run(args: argparse.Namespace, setup: Setup) -> Results:
    quick = args.quick
    jobs: list[tuple[str, Measure, bool]] = [
        ("start", start_to_initialize, False),
        ("auto", lambda p, pid: start_to_initialize(p, pid, "auto"), False),
        ("rtt", lambda p, pid: round_trip(p, 500 if quick else 2000, pid), False),
        ("notes_c2a", lambda p, pid: notes_to_agent(p, 20_000 if quick else 50_000, pid), False),
        ("notes_a2c", lambda p, pid: notes_to_client(p, 20_000 if quick else 50_000, pid), False),
        ("mib1", lambda p, pid: frames_1mib(p, 16 if quick else 32, pid), False),
        ("mib16", lambda p, pid: frames_16mib(p, 2 if quick else 4, pid), False),
        ("slow", lambda p, pid: slow_reader(p, 1.0 if quick else 2.0, pid), False),
        ("claude", lambda p, _: claude_turn(p, setup.claude_cwd), True),
    ]
    if args.only:
        jobs = [job for job in jobs if job[0] in args.only]
    results = Results()
    for round_number in range(args.rounds):
        order = PATHS[round_number % len(PATHS) :] + PATHS[: round_number % len(PATHS)]
        results.load.append(os.getloadavg()[0])
        for name, job, claude in jobs:
            for path in order:
                started = time.perf_counter()
                results.add(path, measure(setup, path, job, claude=claude, auto=name == "auto"))
                if args.verbose:
                    elapsed = time.perf_counter() - started
                    print(f"  round {round_number + 1} {name} {path}: {elapsed:.1f} s",
                          file=sys.stderr)  # fmt: skip
    return results


# ------------------------------------------------------------------ report


def number(value: float, digits: int) -> str:
    if value >= 100_000:
        return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k"
    return f"{value:.{digits}f}"


def cell(samples: list[float] | None, digits: int) -> str:
    if not samples:
        return "-"
    low, high = min(samples), max(samples)
    spread = f" [{number(low, digits)}-{number(high, digits)}]" if len(samples) > 1 else ""
    return number(statistics.median(samples), digits) + spread


def ratio(results: Results, figure: Figure, top: str, bottom: str) -> str:
    a, b = results.median(figure.key, top), results.median(figure.key, bottom)
    if a is None or b is None or b == 0:
        return "-"
    value = a / b
    better = value > 1 if figure.higher_is_better else value < 1
    return f"{value:.2f} ({'better' if better else 'worse'})" if value != 1 else "1.00"


def report(results: Results, rounds: int) -> None:
    loads = ", ".join(f"{load:.2f}" for load in results.load)
    print(f"medians of {rounds} interleaved rounds, [min-max]; load average at each round: {loads}")
    head = ["figure", "unit", *PATHS, "bridge/conductor", "bridge/direct", "bridge/raw",
            "conductor/direct", "raw/direct"]  # fmt: skip
    rows = [head]
    for figure in FIGURES:
        if figure.key not in results.values:
            continue
        values = results.values[figure.key]
        rows.append(
            [figure.label, figure.unit, *(cell(values.get(p), figure.digits) for p in PATHS),
             ratio(results, figure, "bridge", "conductor"),
             ratio(results, figure, "bridge", "direct"),
             ratio(results, figure, "bridge", "raw"),
             ratio(results, figure, "conductor", "direct"),
             ratio(results, figure, "raw", "direct")]
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print(
            "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        )
    if "rss16" in results.values:
        print("peak RSS in frames of 16 MiB: " + ", ".join(
            f"{p} {m * 1e6 / (16 * MiB):.1f}x" for p in PATHS
            if (m := results.median("rss16", p)) is not None))  # fmt: skip
    print("ratios are of the medians; 'better' is from the left-hand path's side")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 5, 1 with --quick")
    parser.add_argument("--quick", action="store_true", help="fewer and smaller samples")
    parser.add_argument("--only", nargs="+", metavar="FIGURE",
                        choices=["start", "auto", "rtt", "notes_c2a", "notes_a2c", "mib1", "mib16",
                                 "slow", "claude"])  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="time each measurement")
    parser.add_argument("--pool", action="store_true", help="also run bench/pool_bench.py")
    parser.add_argument(
        "--bridge-python",
        default=sys.executable,
        metavar="PYTHON",
        help="the interpreter that runs the bridge (default: this one)",
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 5

    conductor_dir = install_conductor()
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="acp-bridge-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "XDG_CONFIG_HOME": tmp, "XDG_STATE_HOME": tmp}
        with claude_setup(work) as (claude, claude_env, claude_cwd):
            setup = Setup(env, conductor_dir, claude, claude_env, claude_cwd, args.bridge_python)
            if not args.only or "claude" in args.only:
                # One untimed turn: the first start of node and Claude Code reads from disk.
                warm_up = Peer(claude, claude_env)
                try:
                    claude_turn(warm_up, claude_cwd)
                finally:
                    warm_up.close(0.0)
            results = run(args, setup)
    load_after = os.getloadavg()
    print(f"python {sys.version.split()[0]}, node {node_version()}, {os.cpu_count()} CPUs; "
          f"load average (1/5/15 min) before {fmt_load(load_before)}, "
          f"after {fmt_load(load_after)}; {time.perf_counter() - started:.0f} s")  # fmt: skip
    print(f"bridge: {' '.join(bridge_command(args.bridge_python))} "
          f"({install_kind(args.bridge_python)} install)")  # fmt: skip
    report(results, args.rounds)
    if args.pool:
        import pool_bench  # imports this module: only once it is loaded

        pool_bench.main(["--rounds", str(args.rounds), "--both"])


def bridge_command(python: str) -> list[str]:
    """How a user starts the bridge installed for ``python``: its ``acp-bridge`` script
    (which imports the entry point directly), else ``python -m acp_bridge``."""
    script = Path(python).parent / "acp-bridge"
    return [str(script)] if script.is_file() else [python, "-m", "acp_bridge"]


def install_kind(python: str) -> str:
    """``editable`` or ``regular``: how acp_bridge is installed for ``python``."""
    code = "import acp_bridge, sys; sys.stdout.write(acp_bridge.__file__)"
    # Not from this checkout's folder, whose acp_bridge would shadow an installed one.
    where = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()
    )
    source = Path(__file__).resolve().parent.parent / "acp_bridge"
    return "editable" if Path(where.stdout).resolve().parent == source else "regular"


def fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "missing"
    return subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()


if __name__ == "__main__":
    main()
