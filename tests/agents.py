"""Install the real ACP agents used by the end-to-end tests.

Every agent is a pinned npm package.  Each one is installed once into its own
directory of a cache that is shared between test runs and pytest workers:

    <root>/<safe-name>@<version>/node_modules/...

``<root>`` is ``$ACP_BRIDGE_AGENT_CACHE`` or ``~/.cache/acp-bridge/agents``.
An install goes into a temporary directory next to the final one and is renamed
into place when npm succeeds, under a file lock, so an interrupted or parallel
install never leaves a half-filled directory behind.

The agents are started directly (node + the package's entry point, or the
platform binary) rather than through ``npx`` or the npm wrapper scripts: that
saves the wrapper's start-up time, and killing the process kills the agent
itself (codex-acp's node wrapper orphans the real binary on SIGTERM).

``python tests/agents.py`` installs everything, prints the resolved commands and
sends each agent an ``initialize`` request; CI runs it to pre-warm the cache.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# @zed-industries/claude-agent-acp: the last release under the old name; reads
# only `_meta.systemPrompt` (string, or {append}), bundles Claude Code 2.1.83.
CLAUDE_LEGACY = ("@zed-industries/claude-agent-acp", "0.23.1")
# Newest release that does not yet advertise `sessionCapabilities.systemPrompt`
# (the spec field arrived in 0.92.0); forwards the whole `_meta.systemPrompt`
# object to the SDK.
CLAUDE_PRE_NATIVE = ("@agentclientprotocol/claude-agent-acp", "0.91.0")
# Advertises `sessionCapabilities.systemPrompt` and handles it natively.
CLAUDE_NATIVE = ("@agentclientprotocol/claude-agent-acp", "0.101.0")
CLAUDE_VERSIONS = (CLAUDE_LEGACY, CLAUDE_PRE_NATIVE, CLAUDE_NATIVE)

GOOSE_VERSION = "1.52.0"
# @zed-industries/codex-acp: the Rust codex-acp, last release (the codex-legacy preset).
CODEX_ACP_VERSION = "0.16.0"
# The registry's codex-acp now: TypeScript on codex's app-server (bundles @openai/codex
# 0.166.0); takes systemPrompt natively in append mode, configured through its environment.
CODEX_ACP_APP_SERVER = ("@agentclientprotocol/codex-acp", "2.6.0")
OPENCODE_VERSION = "1.18.33"
COPILOT_VERSION = "1.0.102"
GEMINI_CLI = ("@google/gemini-cli", "0.61.0")
QWEN_CODE = ("@qwen-code/qwen-code", "0.24.4")
# npm `cline` is a node launcher for the platform package's compiled binary.
CLINE_VERSION = "3.0.65"
# The newest Kilo with a linux-x64 binary; no `@kilocode/cli` launcher of this version exists.
KILO_VERSION = "7.7.9"

INSTALL_TIMEOUT = 1800.0
_MARKER = ".acp-bridge-installed"


def cache_root() -> Path:
    """Directory that holds one sub-directory per installed package version."""
    configured = os.environ.get("ACP_BRIDGE_AGENT_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "acp-bridge" / "agents"


def _safe_name(package: str) -> str:
    return package.lstrip("@").replace("/", "+")


def install_dir(package: str, version: str) -> Path:
    return cache_root() / f"{_safe_name(package)}@{version}"


def package_dir(package: str, version: str) -> Path:
    """Where ``package`` lives inside its install directory."""
    return install_dir(package, version) / "node_modules" / package


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(package: str, version: str) -> Path:
    """Install ``package@version`` unless already cached; return its install directory."""
    target = install_dir(package, version)
    if (target / _MARKER).is_file():
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{target.name}.lock"):
        if (target / _MARKER).is_file():
            return target
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not on PATH; it is needed to install the test agents")
        if target.exists():  # left over without a marker: not a finished install
            shutil.rmtree(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            cmd = [
                npm,
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(staging),
                f"{package}@{version}",
            ]
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                check=False,
            )
            if proc.returncode != 0:
                output = (proc.stdout + proc.stderr)[-4000:]
                raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}")
            if not (staging / "node_modules" / package).is_dir():
                raise RuntimeError(f"npm did not install {package}@{version}")
            (staging / _MARKER).write_text(f"{package}@{version}\n")
            staging.chmod(0o755)  # mkdtemp creates it private
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _platform_suffix() -> str:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        arch = "x64"
    elif machine in ("aarch64", "arm64"):
        arch = "arm64"
    else:
        raise RuntimeError(f"no prebuilt agent binaries for machine {machine!r}")
    return f"{sys.platform}-{arch}"


def installed_file(package: str, version: str, *parts: str) -> Path:
    """``parts`` inside the installed ``package@version`` (installed now if it is not);
    an error if the package has no such file."""
    install(package, version)
    path = package_dir(package, version).joinpath(*parts)
    if not path.is_file():
        raise RuntimeError(f"{path} is missing")
    return path


def node_command(entry: Path, *args: str) -> list[str]:
    """``entry`` (a package's JavaScript) run by node directly."""
    return [shutil.which("node") or "node", str(entry), *args]


def claude_agent_command(package: str, version: str) -> list[str]:
    """Command that starts claude-agent-acp ``package@version`` speaking ACP on stdio."""
    return node_command(installed_file(package, version, "dist", "index.js"))


def goose_binary(version: str = GOOSE_VERSION) -> Path:
    """The goose CLI (run it as ``goose acp``); ``$GOOSE_BINARY`` overrides the install."""
    override = os.environ.get("GOOSE_BINARY")
    if override:
        return Path(override)
    package = f"@aaif/goose-binary-{_platform_suffix()}"
    install(package, version)
    return package_dir(package, version) / "bin" / "goose"


def codex_acp_binary(version: str = CODEX_ACP_VERSION) -> Path:
    """The native codex-acp binary (not the node wrapper of @zed-industries/codex-acp)."""
    package = f"@zed-industries/codex-acp-{_platform_suffix()}"
    install(package, version)
    return package_dir(package, version) / "bin" / "codex-acp"


def codex_acp_command() -> list[str]:
    """The 2.x codex-acp (``@agentclientprotocol/codex-acp``) run by node directly; it
    starts the bundled codex app-server itself."""
    package, version = CODEX_ACP_APP_SERVER
    return node_command(installed_file(package, version, "dist", "index.js"))


def opencode_binary(version: str = OPENCODE_VERSION) -> Path:
    """The opencode binary (run it as ``opencode acp``).

    ``opencode-ai``'s install script puts the binary for this machine (chosen among its
    optional platform packages) at ``bin/opencode.exe``, the package's own ``bin`` entry.
    """
    package = "opencode-ai"
    return installed_file(package, version, "bin", "opencode.exe")


def copilot_binary(version: str = COPILOT_VERSION) -> Path:
    """The native GitHub Copilot CLI (run it as ``copilot --acp``), not its node loader."""
    package = f"@github/copilot-{_platform_suffix()}"
    return installed_file(package, version, "copilot")


def cline_binary(version: str = CLINE_VERSION) -> Path:
    """The compiled cline binary (run it as ``cline --acp``), not npm ``cline``'s node
    launcher, which would stay between the bridge and the agent."""
    package = f"@cline/cli-{_platform_suffix()}"
    return installed_file(package, version, "bin", "cline")


def kilo_binary(version: str = KILO_VERSION) -> Path:
    """The Kilo binary (run it as ``kilo acp``) from its platform package."""
    package = f"@kilocode/cli-{_platform_suffix()}"
    return installed_file(package, version, "bin", "kilo")


def gemini_command() -> list[str]:
    """``gemini --acp`` from the pinned @google/gemini-cli bundle, run by node directly."""
    package, version = GEMINI_CLI
    return node_command(installed_file(package, version, "bundle", "gemini.js"), "--acp")


def qwen_command() -> list[str]:
    """``qwen --acp`` from the pinned @qwen-code/qwen-code package, run by node directly."""
    package, version = QWEN_CODE
    return node_command(installed_file(package, version, "cli-entry.js"), "--acp")


def codex_endpoint_args(provider: str, name: str, endpoint_url: str) -> list[str]:
    """codex-acp ``-c`` options that send its model calls to a fake OpenAI Responses endpoint.

    ``endpoint_url`` is the endpoint's base URL without ``/v1``. The key comes from
    ``FAKE_OPENAI_API_KEY`` (see :func:`codex_endpoint_env`); retries and websockets are off
    so every model call is exactly one recorded request.
    """
    config = (
        f'{{name="{name}",base_url="{endpoint_url}/v1",wire_api="responses",'
        f'env_key="FAKE_OPENAI_API_KEY",request_max_retries=0,stream_max_retries=0,'
        f"supports_websockets=false}}"
    )
    return [
        "-c",
        f"model_provider={provider}",
        "-c",
        f"model_providers.{provider}={config}",
        "-c",
        "model=gpt-5.4",
    ]


def codex_endpoint_env(base: Mapping[str, str], codex_home: Path, key: str) -> dict[str, str]:
    """``base`` without the user's OpenAI settings, with its own CODEX_HOME and the fake key."""
    env = {
        k: v
        for k, v in base.items()
        if k not in ("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL")
    }
    env.update(CODEX_HOME=str(codex_home), FAKE_OPENAI_API_KEY=key)
    return env


def clean_agent_env(base: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``base`` fit for spawning agents.

    claude-agent-acp 0.23.1 misbehaves with ``IS_SANDBOX=yes``; ``1`` works for
    every version (and lets root use bypassPermissions).
    """
    env = dict(base)
    env["IS_SANDBOX"] = "1"
    return env


def agent_commands() -> dict[str, list[str]]:
    """Install every pinned agent; map a short name to its start command."""
    commands = {
        f"claude-agent-acp@{version}": claude_agent_command(package, version)
        for package, version in CLAUDE_VERSIONS
    }
    commands[f"goose@{GOOSE_VERSION}"] = [str(goose_binary()), "acp"]
    commands[f"codex-acp@{CODEX_ACP_VERSION}"] = [str(codex_acp_binary())]
    commands[f"codex-acp@{CODEX_ACP_APP_SERVER[1]}"] = codex_acp_command()
    commands[f"opencode@{OPENCODE_VERSION}"] = [str(opencode_binary()), "acp"]
    commands[f"copilot@{COPILOT_VERSION}"] = [str(copilot_binary()), "--acp"]
    commands[f"cline@{CLINE_VERSION}"] = [str(cline_binary()), "--acp"]
    commands[f"kilo@{KILO_VERSION}"] = [str(kilo_binary()), "acp"]
    commands[f"gemini-cli@{GEMINI_CLI[1]}"] = gemini_command()
    commands[f"qwen-code@{QWEN_CODE[1]}"] = qwen_command()
    return commands


def install_all() -> dict[str, list[str]]:
    return agent_commands()


def probe_initialize(
    command: Sequence[str], env: Mapping[str, str], timeout: float = 60.0
) -> dict[str, Any]:
    """Start an agent, send ``initialize``, return the response and kill the agent."""
    request = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}},
    }
    proc = subprocess.Popen(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def kill() -> None:
        # codex-acp ignores stdin EOF: end the whole process group.
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill)  # readline() itself cannot time out
    watchdog.start()
    try:
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        for line in proc.stdout:
            message = json.loads(line)
            if message.get("id") == 0:
                return dict(message)
        raise RuntimeError(f"{command[0]} gave no initialize response within {timeout} s")
    finally:
        watchdog.cancel()
        kill()
        proc.wait()


def main(argv: Sequence[str]) -> int:
    probe = "--no-probe" not in argv
    print(f"agent cache: {cache_root()}", file=sys.stderr)
    started = time.monotonic()
    commands = install_all()
    print(f"installed in {time.monotonic() - started:.1f} s", file=sys.stderr)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="acp-bridge-probe-") as home:
        env = clean_agent_env(os.environ)
        env["HOME"] = home
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            env.pop(name, None)
        env["CODEX_HOME"] = str(Path(home) / "codex")
        Path(env["CODEX_HOME"]).mkdir()
        for name, command in commands.items():
            print(f"{name}: {' '.join(command)}")
            if not probe:
                continue
            try:
                result = probe_initialize(command, env).get("result", {})
                info = json.dumps(result.get("agentInfo"), sort_keys=True)
                session = sorted(result.get("agentCapabilities", {}).get("sessionCapabilities", {}))
                print(f"  agentInfo={info} sessionCapabilities={session}")
            except (RuntimeError, OSError, ValueError) as exc:
                failures += 1
                print(f"  initialize FAILED: {exc}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
