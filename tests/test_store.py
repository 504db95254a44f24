"""The session store: round trips, upsert rules, file safety and several writer processes."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.state.store import SCHEMA_VERSION, SessionStore, StoreError

PROMPT = SystemPrompt.from_wire(
    {
        "mode": "append",
        "content": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Café ☕"}],
        "_meta": {"origin": "test"},
    }
)
OTHER = SystemPrompt.of_text("override", "You are a pirate.")


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "state" / "sessions.sqlite3")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_saved_session_round_trips_with_its_prompt(store: SessionStore) -> None:
    saved = store.save("claude", "s1", PROMPT)
    got = store.get("claude", "s1")
    assert got == saved
    assert got is not None
    assert got.prompt == PROMPT
    assert got.prompt is not None and got.prompt.meta == {"origin": "test"}
    assert got.prompt.text == "Be terse.\n\nCafé ☕"
    assert got.live is True
    assert got.delivered is None
    assert got.parent_id is None
    assert got.created_at == got.updated_at


def test_session_without_prompt_is_stored_as_agent_default(store: SessionStore) -> None:
    store.save("goose", "s1", None, live=False)
    got = store.get("goose", "s1")
    assert got is not None
    assert got.prompt is None
    assert got.live is False


def test_unknown_session_is_none(store: SessionStore) -> None:
    assert store.get("claude", "nope") is None


def test_sessions_are_keyed_by_agent_and_id(store: SessionStore) -> None:
    store.save("claude", "same", PROMPT)
    store.save("codex", "same", OTHER)
    claude, codex = store.get("claude", "same"), store.get("codex", "same")
    assert claude is not None and claude.prompt == PROMPT
    assert codex is not None and codex.prompt == OTHER


def test_save_again_keeps_created_at_delivered_and_parent(store: SessionStore) -> None:
    first = store.save("claude", "fork", PROMPT, parent_id="origin")
    store.set_delivered("claude", "fork", PROMPT.fingerprint())
    second = store.save("claude", "fork", OTHER, live=False)
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    assert second.prompt == OTHER
    assert second.live is False
    assert second.delivered == PROMPT.fingerprint()
    assert second.parent_id == "origin"


def test_save_with_new_parent_replaces_parent(store: SessionStore) -> None:
    store.save("claude", "fork", PROMPT, parent_id="a")
    assert store.save("claude", "fork", PROMPT, parent_id="b").parent_id == "b"


def test_save_can_clear_the_prompt(store: SessionStore) -> None:
    store.save("claude", "s", PROMPT)
    assert store.save("claude", "s", None).prompt is None


def test_set_live_and_set_delivered_update_only_their_field(store: SessionStore) -> None:
    store.save("claude", "s", PROMPT)
    store.set_live("claude", "s", False)
    store.set_delivered("claude", "s", "abc")
    got = store.get("claude", "s")
    assert got is not None
    assert (got.live, got.delivered, got.prompt) == (False, "abc", PROMPT)
    store.set_delivered("claude", "s", None)
    got = store.get("claude", "s")
    assert got is not None and got.delivered is None


def test_updates_of_unknown_sessions_are_no_ops(store: SessionStore) -> None:
    store.set_live("claude", "ghost", False)
    store.set_delivered("claude", "ghost", "abc")
    assert store.get("claude", "ghost") is None
    assert store.list() == []


def test_forget_reports_whether_the_session_existed(store: SessionStore) -> None:
    store.save("claude", "s", PROMPT)
    assert store.forget("claude", "s") is True
    assert store.get("claude", "s") is None
    assert store.forget("claude", "s") is False


def test_forget_all_can_be_limited_to_one_agent(store: SessionStore) -> None:
    for agent in ("claude", "goose"):
        for n in range(3):
            store.save(agent, f"s{n}", PROMPT)
    assert store.forget_all("goose") == 3
    assert {r.agent for r in store.list()} == {"claude"}
    assert store.forget_all() == 3
    assert store.list() == []


def test_list_is_newest_first_and_filters_by_agent(store: SessionStore) -> None:
    store.save("claude", "old", PROMPT)
    store.save("goose", "middle", PROMPT)
    store.save("claude", "new", PROMPT)
    assert [r.session_id for r in store.list()] == ["new", "middle", "old"]
    store.set_live("claude", "old", False)
    assert [r.session_id for r in store.list("claude")] == ["old", "new"]
    assert store.list("nobody") == []


def test_memory_store_works_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with SessionStore(":memory:") as memory:
        memory.save("claude", "s", PROMPT)
        got = memory.get("claude", "s")
        assert got is not None and got.prompt == PROMPT
    assert list(tmp_path.iterdir()) == []


def test_state_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    first = SessionStore(path)
    first.save("claude", "s", PROMPT, parent_id="p")
    first.close()
    with SessionStore(path) as second:
        got = second.get("claude", "s")
    assert got is not None
    assert (got.prompt, got.parent_id) == (PROMPT, "p")


def test_database_and_new_folders_are_private(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "sessions.sqlite3"
    old_umask = os.umask(0o022)
    try:
        store = SessionStore(path)
        store.save("claude", "s", PROMPT)
    finally:
        os.umask(old_umask)
    assert mode_of(path) == 0o600
    assert mode_of(path.parent) == 0o700
    assert mode_of(path.parent.parent) == 0o700
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            assert mode_of(companion) == 0o600
    store.close()


def test_existing_loose_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    path.touch()
    path.chmod(0o644)
    SessionStore(path).close()
    assert mode_of(path) == 0o600


def test_database_uses_wal_and_a_versioned_schema(store: SessionStore) -> None:
    store.close()
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        db.close()


def test_default_path_honours_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert SessionStore.default_path() == tmp_path / "xdg" / "acp-bridge" / "sessions.sqlite3"


@pytest.mark.parametrize("value", [None, "", "relative/state"])
def test_default_path_falls_back_to_local_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", value)
    expected = tmp_path / ".local" / "state" / "acp-bridge" / "sessions.sqlite3"
    assert SessionStore.default_path() == expected


def test_non_sqlite_file_gives_a_store_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(StoreError, match=str(path)):
        SessionStore(path)


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE bookmarks (url TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=r"belongs to something else"):
        SessionStore(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    SessionStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        SessionStore(path)


def test_unwritable_location_gives_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=str(blocker)):
        SessionStore(blocker / "sessions.sqlite3")


def test_closed_store_refuses_use(store: SessionStore) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get("claude", "s")


WRITERS = 4
SESSIONS_PER_WRITER = 250


def _write_many(path: str, writer: int, start: multiprocessing.synchronize.Event) -> None:
    store = SessionStore(path)
    start.wait()
    for n in range(SESSIONS_PER_WRITER):
        prompt = SystemPrompt.of_text("append", f"writer {writer} session {n}")
        store.save(f"agent-{writer % 2}", f"w{writer}-s{n}", prompt, parent_id=f"w{writer}")
        # Every writer also touches a shared row, so they really contend for it.
        store.save("shared", "hot", prompt)
        if n % 10 == 0:
            store.set_delivered(f"agent-{writer % 2}", f"w{writer}-s{n}", prompt.fingerprint())
    store.close()


def test_concurrent_processes_lose_no_sessions(tmp_path: Path) -> None:
    path = str(tmp_path / "shared" / "sessions.sqlite3")
    # Forked: each writer is a process of its own, with its own connection, as bridges
    # are; spawned, each imported this module and its test tools again (0.7 s of CPU).
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [
        context.Process(target=_write_many, args=(path, writer, start)) for writer in range(WRITERS)
    ]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * WRITERS

    with SessionStore(path) as store:
        records = store.list()
        assert len(records) == WRITERS * SESSIONS_PER_WRITER + 1
        for writer in range(WRITERS):
            for n in range(SESSIONS_PER_WRITER):
                got = store.get(f"agent-{writer % 2}", f"w{writer}-s{n}")
                assert got is not None
                assert got.prompt is not None
                assert got.prompt.text == f"writer {writer} session {n}"
                assert got.parent_id == f"w{writer}"
                expected = got.prompt.fingerprint() if n % 10 == 0 else None
                assert got.delivered == expected


def test_each_write_of_the_session_table_reaches_the_store(store: SessionStore) -> None:
    from acp_bridge.core.sessions import Forget, MarkClosed, SaveSession, SetDelivered
    from acp_bridge.state.lifecycle import Lifecycle

    lifecycle = Lifecycle(store, "agent")
    lifecycle.apply(SaveSession("parent", PROMPT))
    lifecycle.apply(SetDelivered("parent", "fp"))
    lifecycle.apply(SaveSession("child", PROMPT, parent_id="parent", new_conversation=True))
    child = lifecycle.get("child")
    assert child is not None and (child.prompt, child.parent_id, child.live) == (
        PROMPT,
        "parent",
        True,
    )
    lifecycle.apply(SaveSession("parent", None))  # the same conversation: delivered stays
    parent = lifecycle.get("parent")
    assert parent is not None and (parent.prompt, parent.delivered) == (None, "fp")
    lifecycle.apply(SaveSession("parent", PROMPT, new_conversation=True))  # the id reused
    parent = lifecycle.get("parent")
    assert parent is not None and parent.delivered is None
    lifecycle.apply(MarkClosed("child"))
    assert lifecycle.get("child").live is False  # type: ignore[union-attr]
    lifecycle.apply(Forget("child"))
    assert lifecycle.get("child") is None


def test_recording_a_session_runs_its_write_and_reads_nothing_back(
    store: SessionStore,
) -> None:
    # Every session/new the bridge intercepts records its session: one upsert in its own
    # transaction, no row read back and no owner looked up in /proc.
    from acp_bridge.core.sessions import SaveSession
    from acp_bridge.state.lifecycle import Lifecycle

    lifecycle = Lifecycle(store, "agent")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    lifecycle.apply(SaveSession("s1", PROMPT, new_conversation=True))
    lifecycle.apply(SaveSession("s1", OTHER))
    store._db.set_trace_callback(None)
    verbs = [statement.split()[0] for statement in statements]
    assert verbs == ["BEGIN", "INSERT", "COMMIT", "BEGIN", "INSERT", "COMMIT"]
    saved = lifecycle.get("s1")
    assert saved is not None and (saved.prompt, saved.live) == (OTHER, True)
