"""How long ``session/new`` takes through the codex adapter, with the real codex-acp.

Two figures, each the median of N runs against the embedded model endpoint:

* **new prompt**: ``session/new`` with a prompt no running process serves, so the bridge
  starts a codex-acp process and replays ``initialize`` to it before forwarding;
* **running prompt**: ``session/new`` with a prompt whose process already runs.

For reference it also times ``session/new`` without a prompt (the primary process).

    python bench/codex_session_new.py [--runs N] [--codex-acp PATH]

Without ``--codex-acp`` the pinned binary is installed (or taken from the cache) by
``tests/agents.py``. CODEX_HOME is a fresh folder under the user's cache (codex wants it
outside /tmp), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from acp_bridge.model_endpoint import open_model_endpoint
from acp_bridge.runtime.client import AcpClient, spawn_bridge

# tests/agents.py installs the pinned codex-acp and knows how to point it at the endpoint.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import agents

PROVIDER = "acp-bridge-bench"


def bridge_command(codex_acp: Path, endpoint_url: str, work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "acp_bridge",
        "--state",
        str(work / "sessions.sqlite3"),
        "--config",
        str(work / "config.yaml"),
        "--",
        str(codex_acp),
        *agents.codex_endpoint_args(PROVIDER, "bench", endpoint_url),
    ]


async def timed_new(client: AcpClient, cwd: Path, prompt: str | None) -> float:
    params: dict[str, Any] = {"cwd": str(cwd), "mcpServers": []}
    if prompt is not None:
        params["systemPrompt"] = {"mode": "append", "content": [{"type": "text", "text": prompt}]}
    started = time.perf_counter()
    await client.request("session/new", params)
    return time.perf_counter() - started


async def run(codex_acp: Path, runs: int, work: Path) -> dict[str, list[float]]:
    home = work / "codex-home"
    home.mkdir()
    env = agents.codex_endpoint_env(os.environ, home, "sk-acp-bridge-bench")
    # Every run's prompt keeps a process with a live session: allow them all.
    (work / "config.yaml").write_text(
        f"bridge:\n  adapter_options:\n    codex: {{max_processes: {runs + 2}}}\n"
    )
    timings: dict[str, list[float]] = {"new prompt": [], "running prompt": [], "no prompt": []}
    async with open_model_endpoint() as endpoint:
        command = bridge_command(codex_acp, endpoint.url, work)
        async with spawn_bridge(command, env) as (client, _):
            await client.request("initialize", {"protocolVersion": 1})
            await timed_new(client, work, None)  # warm the primary (first session/new)
            for run_index in range(runs):
                prompt = f"bench prompt {run_index}"
                timings["new prompt"].append(await timed_new(client, work, prompt))
                timings["running prompt"].append(await timed_new(client, work, prompt))
                timings["no prompt"].append(await timed_new(client, work, None))
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per figure (default 7)")
    parser.add_argument("--codex-acp", type=Path, help="the codex-acp binary")
    args = parser.parse_args()
    codex_acp = args.codex_acp
    if codex_acp is None:
        codex_acp = agents.codex_acp_binary()
    base = Path.home() / ".cache" / "acp-bridge" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="codex-", dir=base))
    try:
        timings = trio.run(run, codex_acp, args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"session/new through acp-bridge, codex-acp {codex_acp.name}, median of N runs")
    for name, values in timings.items():
        ms = sorted(v * 1000 for v in values)
        print(
            f"  {name:<15} median {statistics.median(ms):7.1f} ms   "
            f"min {ms[0]:7.1f}   max {ms[-1]:7.1f}   N={len(ms)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
