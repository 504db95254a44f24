"""The durable session table: which prompt each session runs with, across restarts.

This module owns the SQLite database the bridge keeps sessions in (§6 of the
specification), keyed by (agent identity, session id). Several bridge processes may share
one file at once: the database runs in WAL mode with a busy timeout, and every write is
its own short ``BEGIN IMMEDIATE`` transaction, so concurrent writers wait for each other
instead of losing rows. The file holds client prompts, so it is private to the user
(mode 0600 in a 0700 folder).

The store is synchronous and cheap (one indexed row per call); a single connection is
guarded by a lock so it may also be used from worker threads.
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

from acp_bridge.system_prompt import SystemPrompt

MEMORY: Final = ":memory:"
SCHEMA_VERSION: Final = 1
# Writers hold the lock for one row's worth of work; ten seconds only runs out when
# another process is stuck inside a transaction, and then failing loudly is better.
BUSY_TIMEOUT_MS: Final = 10_000
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
_COLUMNS: Final = "agent, session_id, prompt, live, delivered, parent_id, created_at, updated_at"


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


class SessionStore:
    """Session state in one SQLite file (or ``":memory:"``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._closed = False
        in_memory = self.path == MEMORY
        if not in_memory:
            _create_private_file(Path(self.path))
        try:
            self._db = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,  # transactions are explicit, see _write()
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the session database: {exc}") from exc
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not in_memory:
                self._db.execute("PRAGMA journal_mode = WAL")
                # WAL makes NORMAL durable against crashes of the bridge; only a power
                # loss can roll back the last commits, which costs at most a re-sent prompt.
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise StoreError(
                f"{self.path}: not a usable acp-bridge session database: {exc}"
            ) from exc
        except StoreError:
            self._db.close()
            raise
        if not in_memory:
            _restrict_companions(Path(self.path))

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
                (agent, session_id),
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
    ) -> SessionRecord:
        """Insert or update a session; an existing row keeps ``created_at``, ``delivered``
        and (unless a new one is given) ``parent_id``."""
        wire = None if prompt is None else json.dumps(prompt.to_wire(), ensure_ascii=False)
        now = time.time()
        with self._write() as db:
            db.execute(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?, ?, ?) "
                "ON CONFLICT (agent, session_id) DO UPDATE SET "
                "prompt = excluded.prompt, live = excluded.live, "
                "parent_id = COALESCE(excluded.parent_id, sessions.parent_id), "
                "updated_at = excluded.updated_at",
                (agent, session_id, wire, int(live), parent_id, now, now),
            )
            row = db.execute(
                f"SELECT {_COLUMNS} FROM sessions WHERE agent = ? AND session_id = ?",
                (agent, session_id),
            ).fetchone()
        return self._record(row)

    def set_live(self, agent: str, session_id: str, live: bool) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET live = ?, updated_at = ? WHERE agent = ? AND session_id = ?",
                (int(live), time.time(), agent, session_id),
            )

    def set_delivered(self, agent: str, session_id: str, fingerprint: str | None) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET delivered = ?, updated_at = ? "
                "WHERE agent = ? AND session_id = ?",
                (fingerprint, time.time(), agent, session_id),
            )

    def forget(self, agent: str, session_id: str) -> bool:
        """Delete one session; ``False`` if it was not stored."""
        with self._write() as db:
            cursor = db.execute(
                "DELETE FROM sessions WHERE agent = ? AND session_id = ?", (agent, session_id)
            )
            return cursor.rowcount > 0

    def forget_all(self, agent: str | None = None) -> int:
        """Delete every session (of one agent if given); returns how many were deleted."""
        with self._write() as db:
            if agent is None:
                cursor = db.execute("DELETE FROM sessions")
            else:
                cursor = db.execute("DELETE FROM sessions WHERE agent = ?", (agent,))
            return cursor.rowcount

    def list(self, agent: str | None = None) -> builtins.list[SessionRecord]:
        """Stored sessions, most recently updated first."""
        query = f"SELECT {_COLUMNS} FROM sessions"
        params: tuple[str, ...] = ()
        if agent is not None:
            query += " WHERE agent = ?"
            params = (agent,)
        query += " ORDER BY updated_at DESC, rowid DESC"
        with self._read() as db:
            rows = db.execute(query, params).fetchall()
        return [self._record(row) for row in rows]

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
                raise StoreError(f"{self.path}: cannot read the session database: {exc}") from exc

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
                raise StoreError(f"{self.path}: cannot write the session database: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.path}: the session store is closed")

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: the session database has schema version {version}, newer than "
                f"this acp-bridge understands ({SCHEMA_VERSION}); upgrade acp-bridge"
            )
        self._db.execute("BEGIN IMMEDIATE")
        try:
            # Another bridge may have created the schema while this one waited for the lock.
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version == 0:
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
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _record(self, row: tuple[object, ...]) -> SessionRecord:
        agent, session_id, wire, live, delivered, parent_id, created_at, updated_at = row
        assert isinstance(agent, str) and isinstance(session_id, str)
        prompt = None
        if wire is not None:
            try:
                prompt = SystemPrompt.from_wire(json.loads(str(wire)))
            except (ValueError, ValidationError) as exc:
                raise StoreError(
                    f"{self.path}: the stored prompt of session {session_id!r} "
                    f"(agent {agent!r}) is damaged: {exc}"
                ) from exc
        return SessionRecord(
            agent=agent,
            session_id=session_id,
            prompt=prompt,
            live=bool(live),
            delivered=None if delivered is None else str(delivered),
            parent_id=None if parent_id is None else str(parent_id),
            created_at=float(str(created_at)),
            updated_at=float(str(updated_at)),
        )


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
        raise StoreError(f"{path}: cannot create the session database: {exc}") from exc


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
