"""The durable session table: which prompt each session runs with, across restarts.

This module owns the SQLite database the bridge keeps sessions in (§6 of the
specification), keyed by (agent identity, session id). Several bridge processes may share
one file at once: the database runs in WAL mode with a busy timeout, and every write is
its own short ``BEGIN IMMEDIATE`` transaction, so concurrent writers wait for each other
instead of losing rows. The file holds client prompts, so it is private to the user
(mode 0600 in a 0700 folder).

The store is synchronous and cheap (one indexed row per call); a single connection is
guarded by a lock so it may also be used from worker threads.

A session is *live* while the bridge process that opened it runs and has not closed it:
each row records its owner (pid and process start time, so a reused pid does not count),
and liveness is judged when the row is read. A bridge killed with SIGKILL therefore
leaves no session that looks live.

Ids and agent names arrive in JSON, which can spell text that has no UTF-8 form (a lone
surrogate, ``"\\ud800"``); SQLite takes only UTF-8 text. Such a value (and only such a
value) is stored as a BLOB of its ``surrogatepass`` UTF-8 bytes (:func:`_column`). A BLOB
never equals TEXT in SQLite, so the encoding is injective: every value is stored and found
exactly, and the TEXT rows of existing databases read as before.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from acp_bridge.core.system_prompt import SystemPrompt

MEMORY: Final = ":memory:"
SCHEMA_VERSION: Final = 2
# Writers hold the lock for one row's worth of work; ten seconds only runs out when
# another process is stuck inside a transaction, and then failing loudly is better.
BUSY_TIMEOUT_MS: Final = 10_000
# Between attempts to switch a new file to WAL while another process does the same.
_WAL_RETRY_PAUSE: Final = 0.01
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    prompt     TEXT,
    live       INTEGER NOT NULL DEFAULT 1,
    delivered  TEXT,
    parent_id  TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (agent, session_id)
);
CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions (updated_at);
"""
# Version 2: who holds a session live (see the module docstring).
_OWNER_COLUMNS: Final = ("owner_pid INTEGER", "owner_started TEXT")
_COLUMNS: Final = (
    "agent, session_id, prompt, live, delivered, parent_id, created_at, updated_at, "
    "owner_pid, owner_started"
)


_INSERT: Final = f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?) "
_SET_OPENED: Final = (
    "prompt = excluded.prompt, live = excluded.live, updated_at = excluded.updated_at, "
    "owner_pid = excluded.owner_pid, owner_started = excluded.owner_started"
)
# Load, resume, a new prompt: the conversation and what it already holds stay.
_SAME_CONVERSATION: Final = (
    f"{_INSERT} ON CONFLICT (agent, session_id) DO UPDATE SET {_SET_OPENED}, "
    "parent_id = COALESCE(excluded.parent_id, sessions.parent_id)"
)
# The id was handed out again for a conversation that starts now: nothing carries over.
_NEW_CONVERSATION: Final = (
    f"{_INSERT} ON CONFLICT (agent, session_id) DO UPDATE SET {_SET_OPENED}, "
    "parent_id = excluded.parent_id, delivered = NULL, created_at = excluded.created_at"
)


class StoreError(Exception):
    """The session database cannot be opened, read or written."""


@dataclass(frozen=True)
class SessionRecord:
    """One stored session."""

    agent: str
    session_id: str
    prompt: SystemPrompt | None
    live: bool
    delivered: str | None
    parent_id: str | None
    created_at: float
    updated_at: float
    owner_pid: int | None = None
    """The bridge process that last opened the session, while it is live."""
    damaged: str | None = None
    """Why the stored prompt could not be read (``prompt`` is then None); listing only."""


class SessionStore:
    """Session state in one SQLite file (or ``":memory:"``)."""

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = BUSY_TIMEOUT_MS / 1000
    ) -> None:
        self.path = os.fspath(path)
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._owner = (os.getpid(), process_started(os.getpid()))
        in_memory = self.path == MEMORY
        if not in_memory:
            _create_private_file(Path(self.path))
        try:
            self._db = sqlite3.connect(
                self.path,
                timeout=busy_timeout,
                isolation_level=None,  # transactions are explicit, see _write()
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the session database: {exc}") from exc
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            if not in_memory:
                self._use_wal()
                # WAL makes NORMAL durable against crashes of the bridge; only a power
                # loss can roll back the last commits, which costs at most a re-sent prompt.
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise StoreError(f"{self.path}: {_describe(exc, self.busy_timeout)}") from exc
        except StoreError:
            self._db.close()
            raise
        if not in_memory:
            _restrict_companions(Path(self.path))

    def _use_wal(self) -> None:
        """Switch the file to WAL, unless it already is.

        Two processes opening one new file at once both try to switch it; SQLite then
        answers one of them SQLITE_BUSY at once, without waiting on the busy timeout
        (waiting could deadlock). So: retry until the busy timeout, and skip the switch
        (which needs an exclusive lock) when another process already made it.
        """
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                (mode,) = self._db.execute("PRAGMA journal_mode").fetchone()
                if str(mode).lower() != "wal":
                    self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(_WAL_RETRY_PAUSE)

    @property
    def may_wait(self) -> bool:
        """Whether a call may wait on another process's lock (up to the busy timeout): an
        in-memory database belongs to this process alone, and each call returns at once."""
        return self.path != MEMORY

    @staticmethod
    def default_path() -> Path:
        """``$XDG_STATE_HOME/acp-bridge/sessions.sqlite3`` (``~/.local/state`` if unset)."""
        state_home = os.environ.get("XDG_STATE_HOME", "")
        # The XDG spec says relative values are invalid and must be ignored.
        base = Path(state_home) if os.path.isabs(state_home) else Path.home() / ".local" / "state"
        return base / "acp-bridge" / "sessions.sqlite3"

    def get(self, agent: str, session_id: str) -> SessionRecord | None:
        with self._read() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM sessions WHERE agent = ? AND session_id = ?",
                (_column(agent), _column(session_id)),
            ).fetchone()
        return None if row is None else self._record(row)

    def save(
        self,
        agent: str,
        session_id: str,
        prompt: SystemPrompt | None,
        *,
        live: bool = True,
        parent_id: str | None = None,
        new_conversation: bool = False,
    ) -> SessionRecord:
        """Insert or update a session (see :meth:`put`) and return it as stored."""
        self.put(
            agent,
            session_id,
            prompt,
            live=live,
            parent_id=parent_id,
            new_conversation=new_conversation,
        )
        record = self.get(agent, session_id)
        assert record is not None
        return record

    def put(
        self,
        agent: str,
        session_id: str,
        prompt: SystemPrompt | None,
        *,
        live: bool = True,
        parent_id: str | None = None,
        new_conversation: bool = False,
    ) -> None:
        """Insert or update a session; an existing row keeps ``created_at``, ``delivered``
        and (unless a new one is given) ``parent_id``. Nothing is read back: this is the
        write the bridge makes for every session it opens.

        ``new_conversation``: the agent handed out this id for a conversation that starts
        now (``session/new`` of an agent that numbers sessions per process, restarted), so
        nothing of an older row with the same id carries over.
        """
        wire = None if prompt is None else prompt.wire_json()
        now = time.time()
        owner = self._owner if live else (None, None)
        upsert = _NEW_CONVERSATION if new_conversation else _SAME_CONVERSATION
        key = (_column(agent), _column(session_id))
        with self._write() as db:
            db.execute(
                upsert,
                (*key, wire, int(live), _optional_column(parent_id), now, now, *owner),
            )

    def set_live(self, agent: str, session_id: str, live: bool) -> None:
        """Mark a session open (owned by this process) or closed."""
        owner_pid, owner_started = self._owner if live else (None, None)
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET live = ?, owner_pid = ?, owner_started = ?, updated_at = ? "
                "WHERE agent = ? AND session_id = ?",
                (
                    int(live),
                    owner_pid,
                    owner_started,
                    time.time(),
                    _column(agent),
                    _column(session_id),
                ),
            )

    def set_delivered(self, agent: str, session_id: str, fingerprint: str | None) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET delivered = ?, updated_at = ? "
                "WHERE agent = ? AND session_id = ?",
                (fingerprint, time.time(), _column(agent), _column(session_id)),
            )

    def forget(self, agent: str, session_id: str) -> bool:
        """Delete one session; ``False`` if it was not stored."""
        with self._write() as db:
            cursor = db.execute(
                "DELETE FROM sessions WHERE agent = ? AND session_id = ?",
                (_column(agent), _column(session_id)),
            )
            return cursor.rowcount > 0

    def forget_all(self, agent: str | None = None) -> int:
        """Delete every session (of one agent if given); returns how many were deleted."""
        with self._write() as db:
            if agent is None:
                cursor = db.execute("DELETE FROM sessions")
            else:
                cursor = db.execute("DELETE FROM sessions WHERE agent = ?", (_column(agent),))
            return cursor.rowcount

    def list(self, agent: str | None = None) -> builtins.list[SessionRecord]:
        """Stored sessions, most recently updated first."""
        query = f"SELECT {_COLUMNS} FROM sessions"
        params: tuple[str | bytes, ...] = ()
        if agent is not None:
            query += " WHERE agent = ?"
            params = (_column(agent),)
        query += " ORDER BY updated_at DESC, rowid DESC"
        with self._read() as db:
            rows = db.execute(query, params).fetchall()
        # One damaged row must not hide every other session: it is listed as damaged.
        return [self._record(row, damaged_ok=True) for row in rows]

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._check_open()
            try:
                yield self._db
            except sqlite3.Error as exc:
                reason = _describe(exc, self.busy_timeout)
                raise StoreError(
                    f"{self.path}: cannot read the session database: {reason}"
                ) from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so a second process waits on the busy
        # timeout instead of failing half-way with SQLITE_BUSY on lock upgrade.
        with self._lock:
            self._check_open()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                reason = _describe(exc, self.busy_timeout)
                raise StoreError(
                    f"{self.path}: cannot write the session database: {reason}"
                ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.path}: the session store is closed")

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        self._refuse_newer(version)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            # Another bridge may have created the schema while this one waited for the lock.
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            self._refuse_newer(version)
            if version == 1:
                for column in _OWNER_COLUMNS:
                    self._db.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version == 0:
                foreign = self._db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'sessions'"
                ).fetchall()
                if foreign:
                    raise StoreError(
                        f"{self.path}: this SQLite file belongs to something else "
                        f"(it has tables {', '.join(name for (name,) in foreign)}); "
                        "choose another state path"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                for column in _OWNER_COLUMNS:
                    self._db.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: the session database has schema version {version}, newer than "
                f"this acp-bridge understands ({SCHEMA_VERSION}); upgrade acp-bridge, or "
                "choose another state path"
            )

    def _record(self, row: tuple[object, ...], *, damaged_ok: bool = False) -> SessionRecord:
        (agent, session_id, wire, live, delivered, parent_id, created_at, updated_at) = row[:8]
        agent, session_id, parent_id = _text(agent), _text(session_id), _text(parent_id)
        owner_pid, owner_started = row[8:10]
        prompt = None
        damaged = None
        try:
            if not isinstance(agent, str) or not isinstance(session_id, str):
                raise ValueError("its agent or session id is not text")
            if wire is not None:
                prompt = SystemPrompt.from_wire(json.loads(str(wire)))
            created, updated = _timestamp(created_at), _timestamp(updated_at)
        except (ValueError, TypeError, RecursionError, ValidationError) as exc:
            damaged = f"the stored session is damaged: {_first_line(exc)}"
            if not damaged_ok:
                raise StoreError(
                    f"{self.path}: session {session_id!r} (agent {agent!r}): {damaged}; "
                    f"forget it with: acp-bridge sessions forget {session_id} --agent {agent}"
                ) from exc
            prompt, created, updated = (
                None,
                _timestamp(created_at, 0.0),
                _timestamp(updated_at, 0.0),
            )
        pid = owner_pid if isinstance(owner_pid, int) else None
        return SessionRecord(
            agent=str(agent),
            session_id=str(session_id),
            prompt=prompt,
            live=bool(live) and pid is not None and _owner_alive(pid, owner_started),
            delivered=None if delivered is None else str(delivered),
            parent_id=None if parent_id is None else str(parent_id),
            created_at=created,
            updated_at=updated,
            owner_pid=pid,
            damaged=damaged,
        )


def _column(text: str) -> str | bytes:
    """How ``text`` is stored and looked up: itself, or, when it has no UTF-8 form (a lone
    surrogate), a BLOB of its ``surrogatepass`` bytes (see the module docstring)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
    return text


def _optional_column(text: str | None) -> str | bytes | None:
    return None if text is None else _column(text)


def _text(value: object) -> object:
    """A stored value as it was saved: a BLOB written by :func:`_column` is text again
    (a BLOB that is not ``surrogatepass`` UTF-8 stays bytes, and the row reads damaged)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return value
    return value


def _timestamp(value: object, default: float | None = None) -> float:
    try:
        return float(str(value))
    except ValueError:
        if default is None:
            raise
        return default


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _describe(exc: sqlite3.Error, busy_timeout: float) -> str:
    """What went wrong, in words that say what to do."""
    text = str(exc)
    lower = text.lower()
    if _is_busy(exc):
        return (
            f"another process holds the database's lock (waited {busy_timeout:g} s); "
            "is a bridge stuck? try again"
        )
    if "not a database" in lower:
        return (
            "the file is not an SQLite database, or its header is damaged; move it away "
            "or choose another state path (--state, bridge.state)"
        )
    if "malformed" in lower or "corrupt" in lower:
        return (
            f"the database is damaged ({text}); move it away or choose another state "
            "path (--state, bridge.state)"
        )
    if "readonly" in lower or "unable to open" in lower or "read-only" in lower:
        return (
            f"{text}: the file or its folder is not writable (SQLite also writes "
            "-wal and -shm files next to it)"
        )
    return text


def process_started(pid: int) -> str | None:
    """An identity of process ``pid`` that a later process with the same pid will not
    have (boot id and start time); None if the process does not exist. Without /proc,
    the pid alone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        return _pid_exists(pid)
    if fields[0] == b"Z":
        return None
    return f"{_boot_id()}:{fields[19].decode()}"  # field 22 of stat: starttime


def _pid_exists(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


_BOOT_ID: str | None = None


def _boot_id() -> str:
    global _BOOT_ID  # noqa: PLW0603 - read once per process
    if _BOOT_ID is None:
        try:
            _BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _BOOT_ID = ""
    return _BOOT_ID


def _owner_alive(pid: int, started: object) -> bool:
    current = process_started(pid)
    return current is not None and current == started


def _create_private_file(path: Path) -> None:
    """Create the folders (0700) and the database file (0600) before SQLite opens it."""
    try:
        _make_private_dirs(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            # An existing file may predate us or have been created with a loose umask.
            # A file owned by someone else keeps its mode (chmod is not ours to do).
            if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
                with contextlib.suppress(PermissionError):
                    os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
    except OSError as exc:
        doing = "open" if path.exists() else "create"
        raise StoreError(f"{path}: cannot {doing} the session database: {exc}") from exc


def _make_private_dirs(folder: Path) -> None:
    # XDG asks for 0700 on every folder it makes; Path.mkdir(parents=True) would give the
    # intermediate ones the umask's mode instead.
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another bridge got there first
            new.mkdir(mode=DIR_MODE)
            new.chmod(DIR_MODE)


def _restrict_companions(path: Path) -> None:
    # SQLite gives -wal/-shm the database file's mode; this only guards against files
    # left behind by an older, looser run.
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        with contextlib.suppress(OSError):
            if companion.stat().st_mode & 0o777 != FILE_MODE:
                companion.chmod(FILE_MODE)
