"""The session store under faults: racing openers, damaged files and rows, locks held too
long, unusable locations, and sessions of bridges that died (spec §6)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from harness import AGENT_NAME, TIMEOUT, FakeAgent, bridge_env, wire_prompt
from memory_agent import FAKE_PYTHON
from preloaded import bridge_client, run_to_end

from acp_bridge.commands.sessions_cli import sessions
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.state.store import SCHEMA_VERSION, SessionStore, StoreError

PROMPT = SystemPrompt.of_text("append", "Be terse.")
WAL_SWITCH = "PRAGMA journal_mode = WAL"


# --- two processes opening one new file ---------------------------------------------------


class Connection(sqlite3.Connection):
    """Records statements; answers the WAL switch SQLITE_BUSY ``busy`` times first, as SQLite
    does at once (without the busy timeout) to one of two processes switching one new file."""

    statements: list[str] = []  # noqa: RUF012 - shared on purpose across a test's openers
    busy = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        Connection.statements.append(sql)
        if sql == WAL_SWITCH and Connection.busy:
            Connection.busy -= 1
            raise sqlite3.OperationalError("database is locked")
        return super().execute(sql, *args)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Connection]]:
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(*args, factory=Connection, **kwargs)

    Connection.statements = []
    Connection.busy = 0
    monkeypatch.setattr(sqlite3, "connect", connect)  # the store calls sqlite3.connect
    yield Connection


def test_the_wal_switch_is_retried_while_another_opener_holds_it(
    tmp_path: Path, recording: type[Connection]
) -> None:
    recording.busy = 3
    with SessionStore(tmp_path / "s.db") as store:
        store.save("a", "s", PROMPT)
    assert recording.statements.count(WAL_SWITCH) == 4
    assert recording.busy == 0


def test_a_file_already_in_wal_mode_is_not_switched_again(
    tmp_path: Path, recording: type[Connection]
) -> None:
    SessionStore(tmp_path / "s.db").close()
    recording.statements.clear()
    recording.busy = 100  # would fail the open if it tried
    with SessionStore(tmp_path / "s.db") as store:
        assert store.list() == []
    assert WAL_SWITCH not in recording.statements


def test_a_wal_switch_that_stays_busy_fails_after_the_busy_timeout(
    tmp_path: Path, recording: type[Connection]
) -> None:
    recording.busy = 10**6
    started = time.monotonic()
    with pytest.raises(StoreError, match="another process holds the database's lock"):
        SessionStore(tmp_path / "s.db", busy_timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 5


# --- damaged files and rows ---------------------------------------------------------------


def test_a_zero_paged_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"\0" * 8192)
    with pytest.raises(StoreError) as caught:
        SessionStore(path)
    message = str(caught.value)
    assert str(path) in message
    assert "not an SQLite database" in message and "choose another state path" in message


def test_damaged_pages_are_named_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        for n in range(200):
            store.save("a", f"s{n}", SystemPrompt.of_text("append", "x" * 500))
    for companion in ("-wal", "-shm"):
        Path(f"{path}{companion}").unlink(missing_ok=True)
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 4] = b"\xff" * 8192
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as caught:
        SessionStore(path).list()
    assert "damaged" in str(caught.value) and "move it away" in str(caught.value)


@pytest.fixture
def damaged_row(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        store.save("claude", "good-1", PROMPT)
        store.save("claude", "bad", PROMPT)
        store.save("goose", "good-2", None)
    db = sqlite3.connect(path)
    db.execute("UPDATE sessions SET prompt = '{not json' WHERE session_id = 'bad'")
    db.commit()
    db.close()
    return path


def test_a_damaged_row_does_not_hide_the_others(damaged_row: Path) -> None:
    with SessionStore(damaged_row) as store:
        records = {r.session_id: r for r in store.list()}
        assert set(records) == {"good-1", "bad", "good-2"}
        assert records["bad"].damaged is not None and records["bad"].prompt is None
        assert records["good-1"].prompt == PROMPT and records["good-1"].damaged is None
        with pytest.raises(StoreError, match="sessions forget bad --agent claude"):
            store.get("claude", "bad")


def test_sessions_list_shows_a_damaged_row_and_every_other(damaged_row: Path) -> None:
    result = CliRunner().invoke(sessions, ["--state", str(damaged_row), "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert {s["sessionId"]: s["mode"] for s in listed} == {
        "good-1": "append",
        "bad": "damaged",
        "good-2": "default",
    }
    table = CliRunner().invoke(sessions, ["--state", str(damaged_row), "list"])
    assert table.exit_code == 0 and "damaged" in table.output
    forget = CliRunner().invoke(
        sessions, ["--state", str(damaged_row), "forget", "bad", "--agent", "claude"]
    )
    assert forget.exit_code == 0, forget.output


def test_a_newer_schema_says_to_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SessionStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="upgrade acp-bridge"):
        SessionStore(path)


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "places.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE moz_places (url TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="belongs to something else"):
        SessionStore(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (0,)


def test_a_location_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    # /proc refuses new folders even to root.
    with pytest.raises(StoreError, match="cannot create the session database"):
        SessionStore("/proc/acp-bridge-test/sessions.sqlite3")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_a_read_only_folder_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    SessionStore(folder / "s.db").close()
    for companion in ("-wal", "-shm"):
        Path(f"{folder / 's.db'}{companion}").unlink(missing_ok=True)
    folder.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not writable"):
            SessionStore(folder / "s.db").save("a", "s", PROMPT)
    finally:
        folder.chmod(0o700)


def test_a_lock_held_too_long_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SessionStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(30, holder.rollback)  # a lock held for 30 s
    release.start()
    try:
        with SessionStore(path, busy_timeout=0.3) as store:
            with pytest.raises(StoreError) as caught:
                store.save("a", "s", PROMPT)
            assert "another process holds the database's lock (waited 0.3 s)" in str(caught.value)
            assert store.list() == []  # readers are not blocked by a writer under WAL
    finally:
        release.cancel()
        holder.rollback()
        holder.close()


# --- live means: the bridge that opened it still runs --------------------------------------


SAVER = """
import sys, time
from acp_bridge.state.store import SessionStore
from acp_bridge.core.system_prompt import SystemPrompt
store = SessionStore(sys.argv[1])
store.save("fake", "opened-by-a-dead-bridge", SystemPrompt.of_text("append", "x"))
print("saved", flush=True)
time.sleep(600)
"""


def test_sessions_of_a_killed_process_are_not_live(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE)
    assert saver.stdout is not None and saver.stdout.readline() == b"saved\n"
    with SessionStore(path) as store:
        store.save("fake", "mine", PROMPT)
        (theirs,) = [r for r in store.list() if r.session_id != "mine"]
        assert theirs.live and theirs.owner_pid == saver.pid
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        live = {r.session_id: r.live for r in store.list()}
    assert live == {"mine": True, "opened-by-a-dead-bridge": False}


def test_a_reused_pid_does_not_make_a_session_live(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        store.save("fake", "s", PROMPT)
    db = sqlite3.connect(path)
    db.execute("UPDATE sessions SET owner_started = 'another process, long gone'")
    db.commit()
    db.close()
    with SessionStore(path) as store:
        record = store.get("fake", "s")
    assert record is not None and record.owner_pid == os.getpid() and not record.live


def test_a_version_1_database_is_upgraded_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE sessions (
            agent TEXT NOT NULL, session_id TEXT NOT NULL, prompt TEXT,
            live INTEGER NOT NULL DEFAULT 1, delivered TEXT, parent_id TEXT,
            created_at REAL NOT NULL, updated_at REAL NOT NULL,
            PRIMARY KEY (agent, session_id));
        CREATE INDEX sessions_by_update ON sessions (updated_at);
        INSERT INTO sessions VALUES ('claude', 's1', NULL, 1, 'fp', NULL, 1.0, 2.0);
        PRAGMA user_version = 1;
        """
    )
    db.close()
    with SessionStore(path) as store:
        record = store.get("claude", "s1")
    assert record is not None
    assert (record.delivered, record.live, record.created_at) == ("fp", False, 1.0)


async def test_sessions_list_after_a_bridge_was_sigkilled_shows_them_not_live(
    tmp_path: Path,
) -> None:
    state = str(tmp_path / "state.db")
    agent = FakeAgent(tmp_path / "agent.jsonl")
    args = ["--state", state, "--", *agent.argv()]
    with trio.fail_after(TIMEOUT):
        async with bridge_client(args, bridge_env(tmp_path)) as (client, process):
            await client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            params = {"cwd": "/", "mcpServers": [], "systemPrompt": wire_prompt("x")}
            session_id = (await client.request("session/new", params))["sessionId"]
            listed = await trio.to_thread.run_sync(list_sessions, state)
            assert listed == {session_id: True}
            process.kill()
            await process.wait()
    assert await trio.to_thread.run_sync(list_sessions, state) == {session_id: False}


def list_sessions(state: str) -> dict[str, bool]:
    """``acp-bridge sessions --state STATE list --json`` (the command, run here: what it
    shows does not depend on the process that lists)."""
    done = CliRunner().invoke(
        sessions, ["--state", state, "list", "--json"], env={"XDG_CONFIG_HOME": os.devnull}
    )
    assert done.exit_code == 0, done.output
    return {s["sessionId"]: s["live"] for s in json.loads(done.stdout) if s["agent"] == AGENT_NAME}


# --- a database the bridge cannot use at start --------------------------------------------

# Answers initialize at once (so the early exchange may answer the client before the bridge
# has loaded and found the database unusable), then every request.
QUICK_AGENT = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message and "method" in message:
        result = {"sessionId": "s1"}
        if message["method"] == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        sys.stdout.write(json.dumps(answer) + "\\n")
        sys.stdout.flush()
"""
EARLY_ANSWER = "initialize before the bridge loaded: answered"


# Runs the rest of its command line in a mount namespace of its own where the folder
# named first is mounted read-only (root ignores file modes: only a mount refuses it).
READ_ONLY_MOUNT = [
    "unshare", "--mount", "sh", "-c",
    'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"', "sh",
]  # fmt: skip


def read_only_mount_works(folder: Path) -> bool:
    probe = subprocess.run(
        [*READ_ONLY_MOUNT, str(folder), "sh", "-c", f"! touch {folder}/probe"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0 and not (folder / "probe").exists()


def unusable(kind: str, tmp_path: Path) -> Path:
    if kind == "read-only-mount":
        # The user's own database, on a file system mounted read-only since.
        folder = tmp_path / "state"
        folder.mkdir()
        if not read_only_mount_works(folder):
            pytest.skip("no mount namespace here to mount a folder read-only")
        path = folder / "sessions.sqlite3"
        SessionStore(path).close()
    elif kind == "garbage":
        path = tmp_path / "garbage.db"
        path.write_bytes(b"not a database at all\x00" * 300)
    elif kind == "directory":
        path = tmp_path / "a-directory"
        path.mkdir()
    else:  # a path under a file
        (tmp_path / "a-file").write_text("")
        path = tmp_path / "a-file" / "sessions.db"
    return path


def request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    return (
        json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        ).encode()
        + b"\n"
    )


@pytest.mark.parametrize("path", ["early", "usual"])
@pytest.mark.parametrize("kind", ["garbage", "directory", "under-a-file", "read-only-mount"])
def test_an_unusable_database_at_start_is_named_to_the_client_and_on_stderr(
    tmp_path: Path, kind: str, path: str
) -> None:
    state = unusable(kind, tmp_path)
    config = []
    if path == "usual":  # a configuration file leaves initialize to the runtime
        (tmp_path / "empty.yaml").write_text("bridge: {}\n")
        config = ["--config", str(tmp_path / "empty.yaml")]
    args = ["--state", str(state), "--log-level", "debug",
            *config, "--", *FAKE_PYTHON, "-c", QUICK_AGENT]  # fmt: skip
    if path == "usual" and kind != "read-only-mount":
        # The runtime answers here, whatever came before ``__main__``: the bridge is forked
        # from the server that has imported it (``preloaded``).
        initialize = request(0, "initialize", {"protocolVersion": 1})
        ran = run_to_end(args, stdin=initialize, env=bridge_env(tmp_path), timeout=TIMEOUT)
        answers = [json.loads(line) for line in ran.stdout.splitlines()]
        status, stderr = ran.returncode, ran.stderr.decode()
    else:
        answers, status, stderr = started_with_python(args, kind, state, tmp_path)
    error = answers[-1]["error"]
    assert answers[-1]["id"] == len(answers) - 1
    assert error["code"] == -32603
    assert str(state) in error["message"] and "session database" in error["message"]
    if kind == "read-only-mount":
        assert "cannot open the session database" in error["message"]
        assert "Read-only file system" in error["message"]
    assert error["data"] == {"database": str(state)}
    assert status != 0
    assert str(state) in stderr
    # The early exchange answers when the agent is quicker than the bridge's loading.
    assert (len(answers) == 2) == (EARLY_ANSWER in stderr)
    if path == "usual":
        assert len(answers) == 1


def started_with_python(
    args: list[str], kind: str, state: Path, tmp_path: Path
) -> tuple[list[Any], int, str]:
    """``python -m acp_bridge ARGS``, under a read-only mount for that kind: the answer to
    ``initialize`` and, where it came before the database was opened, to ``session/new``;
    then, with stdin closed, the exit status and stderr."""
    argv = [sys.executable, "-m", "acp_bridge", *args]
    if kind == "read-only-mount":
        argv = [*READ_ONLY_MOUNT, str(state.parent), *argv]
    bridge = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=bridge_env(tmp_path),
    )
    assert bridge.stdin is not None and bridge.stdout is not None and bridge.stderr is not None
    try:
        bridge.stdin.write(request(0, "initialize", {"protocolVersion": 1}))
        bridge.stdin.flush()
        answers = [json.loads(bridge.stdout.readline())]
        if "result" in answers[0]:  # answered before the database was opened
            bridge.stdin.write(request(1, "session/new", {"cwd": "/", "mcpServers": []}))
            bridge.stdin.flush()
            answers.append(json.loads(bridge.stdout.readline()))
        bridge.stdin.close()
        status = bridge.wait(timeout=TIMEOUT)
        stderr = bridge.stderr.read().decode()
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait()
    return answers, status, stderr
