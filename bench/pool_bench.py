"""What ``session/new`` costs for the agents that take their prompt per process.

    python bench/pool_bench.py [--rounds 3] [--agents codex gemini ...] [--both | --no-spare]
                               [--seen N] [--verbose]

``python bench/peer_bench.py --pool`` runs it after the peer figures.

For each agent a pool adapter serves (one agent process per distinct system prompt), in
the same run, interleaved (the order of the agents and of the paths turns from round to
round), against the embedded model endpoint (each preset's ``verify:`` section in
``config/presets.yaml`` says how the agent is pointed at it; the agents come from
``tests/agents.py``'s cache):

* **cold start**: the agent alone, spawn -> ``initialize`` -> ``session/new`` answered;
* **direct session/new**: ``session/new`` on that already running agent (its second and
  later ones, the median of five);
* **bridge, new prompt**: ``session/new`` with a system prompt no process of the bridge
  serves yet (``acp-bridge --adapter NAME``, after ``initialize`` and one session without
  a prompt), three per bridge: without spares (the default) each starts a process; with
  ``bridge.adapter_options.<name>.spare: true`` the first one does (no spare runs yet)
  and the next ones claim the spare started after the one before;
* **bridge, seen prompt**: ``session/new`` again with that prompt, served by its process
  (the median of ``--seen`` calls, default three), and the CPU time the bridge process
  spent per such call (``peer_bench.cpu_seconds``; unlike the wall-clock rows it hardly
  depends on the load);
* **direct beside it**: the agent alone, started after each new prompt's call (so that the
  call shares the machine only with what a user's bridge runs), its ``session/new`` calls
  taken in turn with the seen-prompt calls (as many, their median). Both run behind the
  same earlier calls and at the same moment's load; a ``session/new`` leaves work running
  behind its answer (codex-acp 0.16 starts login shells for its environment snapshot) that
  slows whatever comes next on a small machine, and the direct row above is measured in
  another phase. **seen/beside** is the fair ratio for a seen prompt.
* **cold start with the prompt**, **direct with the prompt**: an agent alone, started
  after the new prompt's call as the bridge starts the process for that prompt (the
  adapter's own ``process_config``: the same arguments, variables and files in a private
  folder): spawn -> ``initialize`` -> ``session/new`` answered, at the same moment of the
  bridge's life as the new prompt (its earlier processes still running), then its
  ``session/new`` calls taken in turn with the other two. An agent may work more per
  session with a prompt than without (Copilot reads its instructions folders at each
  ``session/new``); **seen/prompted** leaves that out, and **new/prompted cold** compares
  a new prompt with the start it needs under the same conditions.

The prompts are ``append`` prompts, ``override`` for qwen and codex-acp 2.6 (the mode in
which each starts a process and can keep a spare one). With spares, the bench waits
``--settle`` seconds after each new prompt (default: 1.5 times the agent's cold start, at
least 2 s), as a user between two sessions would, so that the spare started after it is
ready before the seen-prompt calls and the next new prompt (a spare's start takes a cold
start's CPU: on two cores, calls made during it take about twice as long).
``--no-spare`` measures the bridge without spares only, ``--both`` both ways.

Printed per agent: the medians of the rounds with their range, the ratios new prompt /
cold start, new prompt / cold start with the prompt, seen prompt / direct session/new,
seen prompt / direct beside it and seen prompt / direct with the prompt, and the load
average at each round.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents
from adapter_context import ContextWithEnvironment, Primary
from peer_bench import Peer, cpu_seconds, fmt_load, new_params, node_version

from acp_bridge.adapter import AdapterContext
from acp_bridge.core.system_prompt import Mode, SystemPrompt
from acp_bridge.model_endpoint import ThreadedModelEndpoint
from acp_bridge.pool import PoolAdapter
from acp_bridge.registry import builtin
from acp_bridge.settings import load_config
from acp_bridge.supervision.private_dirs import PrivateDir

# Direct session/new calls timed on a running agent, per round.
DIRECT_NEWS: Final = 5
# New prompts per bridge per round, each followed by this many sessions with it again.
NEW_PROMPTS: Final = 3
SEEN_NEWS: Final = 3
INITIALIZE: Final = {"protocolVersion": 1, "clientCapabilities": {}}
# An npm registry nobody listens on: agents that install plugins on start stay offline.
OFFLINE_REGISTRY: Final = "http://127.0.0.1:9/"


@dataclass(frozen=True)
class PooledAgent:
    """One agent a pool adapter serves: its start command and its preset."""

    name: str
    """The preset's name."""
    adapter: str
    command: Callable[[], list[str]]
    mode: Mode = "append"
    """The prompt mode measured: one the adapter starts a process for, and keeps a spare
    process for if it can."""


POOLED_AGENTS: Final = (
    PooledAgent("codex-legacy", "codex", lambda: [str(agents.codex_acp_binary())]),
    # codex-acp 2.x takes append prompts natively, in the primary: override needs a process.
    PooledAgent("codex", "codex", agents.codex_acp_command, "override"),
    PooledAgent("gemini", "gemini", agents.gemini_command),
    PooledAgent("qwen", "qwen", agents.qwen_command, "override"),
    PooledAgent("opencode", "opencode", lambda: [str(agents.opencode_binary()), "acp"]),
    PooledAgent("copilot", "copilot", lambda: [str(agents.copilot_binary()), "--acp"]),
    PooledAgent("cline", "cline", lambda: [str(agents.cline_binary()), "--acp"]),
    PooledAgent("kilo", "kilo", lambda: [str(agents.kilo_binary()), "acp"]),
)


@dataclass
class Setup:
    """One agent ready to be started: argv, environment and working folder."""

    agent: PooledAgent
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    config: Path
    """The bridge's configuration file (pool options)."""
    no_spare_config: Path
    initialize_result: dict[str, Any] | None = None
    """The agent's answer to ``initialize`` (the untimed first start reads it)."""


@contextmanager
def agent_setup(agent: PooledAgent, work: Path, endpoint_url: str) -> Iterator[Setup]:
    """The agent pointed at the endpoint as its preset's ``verify:`` section says."""
    home = work / agent.name
    home.mkdir()
    (home / "project").mkdir()
    preset = load_config().agent(agent.name)
    spec = preset.verify
    assert spec is not None, f"preset {agent.name} has no verify section"
    variables = {**os.environ, "ENDPOINT_URL": endpoint_url, "VERIFY_HOME": str(home)}
    for folder in spec.resolved_dirs(variables):
        folder.mkdir(parents=True, exist_ok=True)
    for path, text in spec.resolved_files(variables).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = agents.clean_agent_env(os.environ)
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env.pop(name, None)
    env.update(preset.resolved_env(variables))
    env.update(spec.resolved_env(variables))
    env["npm_config_registry"] = OFFLINE_REGISTRY
    # Enough processes for every prompt of a round; the bridge's own files in the home.
    options = f"max_processes: {2 * NEW_PROMPTS + 2}"
    config = home / "bridge.yaml"
    config.write_text(
        f"bridge:\n  adapter_options:\n    {agent.adapter}: {{{options}, spare: true}}\n"
    )
    no_spare = home / "bridge-no-spare.yaml"
    no_spare.write_text(
        f"bridge:\n  adapter_options:\n    {agent.adapter}: {{{options}, spare: false}}\n"
    )
    codex_home = env.get("CODEX_HOME")
    if codex_home:
        # A codex home has sessions/ once its user had one conversation, and the codex
        # adapter makes it before its first private home links it. codex-acp 0.16's
        # session/new takes about twice as long with it (8-10 ms against 20-24 ms, even
        # empty), so without it here the direct path would be measured against a home
        # the bridged paths never see.
        (Path(codex_home) / "sessions").mkdir(parents=True, exist_ok=True)
    argv = [*agent.command(), *spec.resolved_args(variables)]
    yield Setup(agent, argv, env, home / "project", config, no_spare)


def timed_new(peer: Peer, cwd: Path, prompt: str | None = None, mode: str = "append") -> float:
    started = time.perf_counter()
    result = peer.request("session/new", new_params(cwd, prompt, mode))
    elapsed = (time.perf_counter() - started) * 1000
    if not isinstance(result, dict) or not isinstance(result.get("sessionId"), str):
        raise RuntimeError(f"session/new answered without a sessionId: {result!r}")
    return elapsed


def direct(setup: Setup) -> dict[str, list[float]]:
    peer = Peer(setup.argv, setup.env, setup.cwd)
    try:
        setup.initialize_result = peer.request("initialize", INITIALIZE)
        timed_new(peer, setup.cwd)
        cold = (time.perf_counter() - peer.started) * 1000
        news = [timed_new(peer, setup.cwd) for _ in range(DIRECT_NEWS)]
    finally:
        peer.close(0.0)
    return {"cold": [cold], "direct": [statistics.median(news)]}


class AgentView(ContextWithEnvironment):
    """What an adapter asks of the bridge to say how a prompt becomes a process: the
    agent's environment and its ``initialize`` answer (codex picks its route by it)."""

    log = logging.getLogger("pool-bench")

    def __init__(
        self, environment: dict[str, str], initialize_result: dict[str, Any] | None
    ) -> None:
        super().__init__(environment)
        self.primary = Primary()
        self.primary.initialize_result = initialize_result


@contextmanager
def prompted_agent(
    setup: Setup, prompt: str, mode: Mode, initialize_result: dict[str, Any] | None
) -> Iterator[Peer]:
    """The agent alone, started as the bridge starts the process for ``prompt``, and
    answered one ``session/new`` (its ``started`` says when it was spawned)."""
    adapter_class = builtin(setup.agent.adapter)
    assert issubclass(adapter_class, PoolAdapter), adapter_class
    # A part of the context: process_config asks for the environment, the options, the
    # log and the primary's answer, and nothing that runs.
    adapter = adapter_class(cast("AdapterContext", AgentView(setup.env, initialize_result)))
    private = PrivateDir.create(f"acp-bridge-{adapter.name}-", adapter.private_root())
    try:
        config = adapter.process_config(SystemPrompt.of_text(mode, prompt), private)
        peer = Peer([*setup.argv, *config.args], {**setup.env, **config.env}, setup.cwd)
        try:
            peer.initialize()
            timed_new(peer, setup.cwd)
            yield peer
        finally:
            peer.close(0.0)
    finally:
        private.remove()


def bridged(setup: Setup, settle: float, spare: bool, seen_calls: int) -> dict[str, list[float]]:
    config = setup.config if spare else setup.no_spare_config
    argv = [
        sys.executable,
        "-m",
        "acp_bridge",
        "--state",
        ":memory:",
        "--log-level",
        "error",
        "--config",
        str(config),
        "--adapter",
        setup.agent.adapter,
        "--",
        *setup.argv,
    ]
    peer = Peer(argv, setup.env, setup.cwd)
    suffix = "" if spare else "_nospare"
    figures: dict[str, list[float]] = {f"new{suffix}": [], f"seen{suffix}": []}
    if spare:
        figures["new_first"] = []
    figures[f"beside{suffix}"] = []
    figures[f"prompted{suffix}"] = []
    figures[f"prompted_cold{suffix}"] = []
    cpu: list[float] = []
    alone = ExitStack()
    try:
        peer.initialize()
        timed_new(peer, setup.cwd)
        for index in range(NEW_PROMPTS):
            prompt = f"pool bench prompt {uuid.uuid4()}"
            mode = setup.agent.mode
            # With spares, the first new prompt finds none: the spare starts after it.
            key = "new_first" if spare and index == 0 else f"new{suffix}"
            figures[key].append(timed_new(peer, setup.cwd, prompt, mode))
            # The agents alone start after the new prompt's call, which they would slow as
            # much as a cold start is slowed by another one: an agent goes on working after
            # its initialize answer (Kilo for seconds).
            prompted = alone.enter_context(
                prompted_agent(setup, prompt, mode, setup.initialize_result)
            )
            figures[f"prompted_cold{suffix}"].append(
                (time.perf_counter() - prompted.started) * 1000
            )
            beside = Peer(setup.argv, setup.env, setup.cwd)
            alone.callback(beside.close, 0.0)
            beside.initialize()
            timed_new(beside, setup.cwd)
            if spare:
                # The spare started after that call is up before the seen calls (and so
                # before the next new prompt): otherwise they share the CPU with its start.
                time.sleep(settle)
            seen: list[float] = []
            direct_news: list[float] = []
            prompted_news: list[float] = []
            cpu_used = 0.0
            for call in range(seen_calls):
                # The three in turn, each call in another place of the turn.
                for step in range(3):
                    which = (call + step) % 3
                    if which == 0:
                        before = cpu_seconds(peer.process.pid)
                        seen.append(timed_new(peer, setup.cwd, prompt, mode))
                        cpu_used += cpu_seconds(peer.process.pid) - before
                    elif which == 1:
                        direct_news.append(timed_new(beside, setup.cwd))
                    else:
                        prompted_news.append(timed_new(prompted, setup.cwd))
            cpu.append(cpu_used / seen_calls * 1000)
            figures[f"seen{suffix}"].append(statistics.median(seen))
            figures[f"beside{suffix}"].append(statistics.median(direct_news))
            figures[f"prompted{suffix}"].append(statistics.median(prompted_news))
            # Gone before the next new prompt, which they would slow too.
            alone.close()
    finally:
        alone.close()
        # EOF: the bridge stops every process it started before it exits.
        peer.close(30.0)
    figures[f"seen_cpu{suffix}"] = cpu
    return figures


@dataclass(frozen=True)
class Figure:
    key: str
    label: str


FIGURES: Final = (
    Figure("cold", "cold start: spawn -> initialize -> session/new"),
    Figure("direct", "direct session/new, running agent"),
    Figure("new_first", "bridge, first new prompt"),
    Figure("new", "bridge, next new prompt (spare)"),
    Figure("new_nospare", "bridge, new prompt, no spare"),
    Figure("prompted_cold", "cold start with the prompt"),
    Figure("prompted_cold_nospare", "cold start with the prompt, no spare"),
    Figure("seen", "bridge, seen prompt"),
    Figure("seen_nospare", "bridge, seen prompt, no spare"),
    Figure("beside", "direct beside the seen prompt"),
    Figure("beside_nospare", "direct beside the seen prompt, no spare"),
    Figure("prompted", "direct with the prompt"),
    Figure("prompted_nospare", "direct with the prompt, no spare"),
    Figure("seen_cpu", "bridge CPU per seen session/new"),
    Figure("seen_cpu_nospare", "bridge CPU per seen session/new, no spare"),
)


@dataclass
class Results:
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)

    def add(self, agent: str, figures: dict[str, list[float]]) -> None:
        for key, samples in figures.items():
            self.values.setdefault(agent, {}).setdefault(key, []).extend(samples)

    def median(self, agent: str, key: str) -> float | None:
        samples = self.values.get(agent, {}).get(key)
        return statistics.median(samples) if samples else None


def cell(samples: list[float] | None) -> str:
    if not samples:
        return "-"
    digits = 1 if max(samples) < 10 else 0
    spread = f" [{min(samples):.{digits}f}-{max(samples):.{digits}f}]" if len(samples) > 1 else ""
    return f"{statistics.median(samples):.{digits}f}{spread}"


def ratio(results: Results, agent: str, top: str, bottom: str) -> str:
    a, b = results.median(agent, top), results.median(agent, bottom)
    return "-" if a is None or not b else f"{a / b:.2f}"


def report(results: Results, names: Sequence[str]) -> None:
    loads = ", ".join(f"{load:.2f}" for load in results.load)
    print(f"load average at each round: {loads}")
    keys = [f for f in FIGURES if any(f.key in results.values.get(n, {}) for n in names)]
    head = ["agent", *(f"{f.label} (ms)" for f in keys), "new/cold", "new/prompted cold"]
    head.append("seen/direct")
    head += ["seen/beside", "seen/prompted"]
    if any("new_nospare" in results.values.get(n, {}) for n in names):
        head += [
            "no spare: new/cold",
            "no spare: new/prompted cold",
            "no spare: seen/direct",
            "no spare: seen/beside",
            "no spare: seen/prompted",
        ]
    rows = [head]
    for name in names:
        row = [
            name,
            *(cell(results.values.get(name, {}).get(f.key)) for f in keys),
            ratio(results, name, "new", "cold"),
            ratio(results, name, "new", "prompted_cold"),
            ratio(results, name, "seen", "direct"),
            ratio(results, name, "seen", "beside"),
            ratio(results, name, "seen", "prompted"),
        ]
        if len(head) > len(row):
            row += [
                ratio(results, name, "new_nospare", "cold"),
                ratio(results, name, "new_nospare", "prompted_cold_nospare"),
                ratio(results, name, "seen_nospare", "direct"),
                ratio(results, name, "seen_nospare", "beside_nospare"),
                ratio(results, name, "seen_nospare", "prompted_nospare"),
            ]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(t.ljust(w) for t, w in zip(row, widths, strict=True)).rstrip())
    print("medians of the rounds [min-max]; bridge rows: every new prompt of every round")


def run(args: argparse.Namespace, setups: list[Setup], results: Results) -> None:
    paths = [
        "direct",
        *(["bridge", "nospare"] if args.both else ["nospare"] if args.no_spare else ["bridge"]),
    ]
    for round_number in range(args.rounds):
        results.load.append(os.getloadavg()[0])
        turn = round_number % len(setups)
        for setup in setups[turn:] + setups[:turn]:
            shift = round_number % len(paths)
            for path in paths[shift:] + paths[:shift]:
                started = time.perf_counter()
                cold = results.median(setup.agent.name, "cold")
                settle = (
                    args.settle if args.settle is not None else max(2.0, 1.5 * (cold or 0) / 1000)
                )
                if path == "direct":
                    figures = direct(setup)
                else:
                    figures = bridged(setup, settle, path == "bridge", args.seen)
                results.add(setup.agent.name, figures)
                if args.verbose:
                    print(
                        f"  round {round_number + 1} {setup.agent.name} {path}: "
                        f"{time.perf_counter() - started:.1f} s "
                        f"(load {os.getloadavg()[0]:.2f}) {figures}",
                        file=sys.stderr,
                    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [agent.name for agent in POOLED_AGENTS]
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agents", nargs="+", choices=names, default=names)
    parser.add_argument(
        "--seen", type=int, default=SEEN_NEWS, help="seen-prompt calls per new prompt"
    )
    parser.add_argument("--settle", type=float, help="seconds after each new prompt (spares)")
    spares = parser.add_mutually_exclusive_group()
    spares.add_argument("--no-spare", action="store_true", help="no spare processes")
    spares.add_argument("--both", action="store_true", help="with and without spares")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    chosen = [agent for agent in POOLED_AGENTS if agent.name in args.agents]
    started = time.perf_counter()
    load_before = os.getloadavg()
    base = Path.home() / ".cache" / "acp-bridge" / "bench"  # codex refuses homes in /tmp
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pool-", dir=base))
    results = Results()
    try:
        with ThreadedModelEndpoint(reply="Hello.") as endpoint, ExitStack() as stack:
            setups = [stack.enter_context(agent_setup(a, work, endpoint.url)) for a in chosen]
            for setup in setups:  # untimed: the first start of each reads from disk
                direct(setup)
            run(args, setups, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"python {sys.version.split()[0]}, node {node_version()}, {os.cpu_count()} CPUs; "
        f"load average (1/5/15 min) before {fmt_load(load_before)}, "
        f"after {fmt_load(os.getloadavg())}; {time.perf_counter() - started:.0f} s; "
        f"{args.rounds} rounds"
    )
    report(results, [a.name for a in chosen])


if __name__ == "__main__":
    main()
