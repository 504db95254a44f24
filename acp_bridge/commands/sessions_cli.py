"""``acp-bridge sessions``: list, show and forget the sessions in the state database.

This module owns only the command-line view of :class:`~acp_bridge.state.store.SessionStore`.
Prompts are private: ``list`` never prints prompt text, ``show`` prints it only with
``--prompt``. Listing or showing never creates a database that does not exist yet.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

import click

from acp_bridge.settings import ConfigError, load_config, resolve_state
from acp_bridge.state.store import MEMORY, SessionRecord, SessionStore, StoreError

_STATE_KEY: Final = "acp_bridge.sessions.state"


@click.group("sessions", invoke_without_command=True)
@click.option(
    "--state",
    "state",
    metavar="PATH",
    default=None,
    help="Session database (default: bridge.state of the configuration, else "
    "$XDG_STATE_HOME/acp-bridge/sessions.sqlite3).",
)
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML config file.")
@click.pass_context
def sessions(ctx: click.Context, state: str | None, config_file: Path | None) -> None:
    """List, show or forget the sessions whose system prompts the bridge remembers.

    Without a command, lists them.
    """
    try:
        if state is None:  # the database the bridge itself uses with this configuration
            state = load_config(config_file).bridge.state
        location = resolve_state(state, os.environ, "--state")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.meta[_STATE_KEY] = str(location)
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_sessions)


@sessions.command("list")
@click.option("--agent", metavar="NAME", help="Only sessions of this agent.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def list_sessions(ctx: click.Context, agent: str | None, as_json: bool) -> None:
    """List stored sessions, most recently updated first (never their prompt text)."""
    with _open_store(ctx) as store:
        records = [] if store is None else store.list(agent)
    if as_json:
        click.echo(json.dumps([_summary(record) for record in records], indent=2))
        return
    if not records:
        scope = "" if agent is None else f" of {agent}"
        click.echo(_printable(f"No stored sessions{scope}."))
        return
    damaged = [r for r in records if r.damaged is not None]
    if damaged:
        click.echo(
            f"{len(damaged)} stored session(s) cannot be read (mode 'damaged'); "
            "'sessions show' says why, 'sessions forget' removes them.",
            err=True,
        )
    rows = [("AGENT", "SESSION ID", "MODE", "LIVE", "UPDATED")]
    rows += [
        (
            _printable(r.agent),
            _printable(r.session_id),
            _mode(r),
            "yes" if r.live else "no",
            _local_time(r.updated_at),
        )
        for r in records
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


@sessions.command("show")
@click.argument("session_id")
@click.option("--agent", metavar="NAME", help="The agent the session belongs to.")
@click.option("--prompt", "with_prompt", is_flag=True, help="Also print the system prompt.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show_session(
    ctx: click.Context, session_id: str, agent: str | None, with_prompt: bool, as_json: bool
) -> None:
    """Show one stored session; its prompt text only with --prompt."""
    with _open_store(ctx) as store:
        record = _find(store, session_id, agent)
    prompt = record.prompt
    if as_json:
        data = _summary(record)
        if with_prompt:
            data["prompt"] = None if prompt is None else prompt.to_wire()
        click.echo(_printable(json.dumps(data, indent=2, ensure_ascii=False)))
        return
    fields = [
        ("agent", record.agent),
        ("session id", record.session_id),
        ("mode", _mode(record)),
        ("live", "yes" if record.live else "no"),
        ("parent", record.parent_id or "-"),
        ("created", _local_time(record.created_at)),
        ("updated", _local_time(record.updated_at)),
    ]
    if prompt is not None:
        fields += [
            ("prompt", f"{len(prompt.text.encode())} bytes in {len(prompt.content)} block(s)"),
            ("fingerprint", prompt.fingerprint()),
        ]
        # Recorded only where the prompt travels in a user turn (the first-turn adapter);
        # every other adapter delivers it with the lifecycle request and records nothing.
        if record.delivered is not None:
            in_turn = (
                "yes"
                if record.delivered == prompt.fingerprint()
                else "an earlier prompt; this one goes with the next turn"
            )
            fields.append(("in a user turn", in_turn))
    if record.damaged is not None:
        fields.append(("damaged", record.damaged))
    width = max(len(name) for name, _ in fields) + 1
    for name, value in fields:
        click.echo(_printable(f"{name + ':':<{width}} {value}"))
    if with_prompt and prompt is not None:
        click.echo()
        click.echo(prompt.text)


@sessions.command("forget")
@click.argument("session_id", required=False)
@click.option("--agent", metavar="NAME", help="The agent the session(s) belong to.")
@click.option("--all", "forget_all", is_flag=True, help="Forget every stored session.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation with --all.")
@click.pass_context
def forget_session(
    ctx: click.Context, session_id: str | None, agent: str | None, forget_all: bool, yes: bool
) -> None:
    """Forget one stored session, or all of them (of one agent) with --all."""
    if forget_all == (session_id is not None):
        raise click.UsageError("Give either a SESSION_ID or --all.")
    if session_id is not None:
        with _open_store(ctx) as store:
            record = _find(store, session_id, agent)
            assert store is not None  # _find fails on a missing database
            store.forget(record.agent, record.session_id)
        click.echo(_printable(f"Forgot session {record.session_id} of {record.agent}."))
        return
    with _open_store(ctx) as store:
        count = 0 if store is None else len(store.list(agent))
        if count == 0:
            click.echo("No stored sessions to forget.")
            return
        scope = f" of {agent}" if agent is not None else ""
        if not yes:
            click.confirm(f"Forget {count} stored session(s){scope}?", abort=True)
        forgotten = store.forget_all(agent) if store is not None else 0
    click.echo(_printable(f"Forgot {forgotten} session(s){scope}."))


@contextmanager
def _open_store(ctx: click.Context) -> Iterator[SessionStore | None]:
    """The store, or ``None`` when its file does not exist (nothing was ever stored)."""
    state: str = ctx.meta[_STATE_KEY]
    if state != MEMORY and not Path(state).expanduser().exists():
        yield None
        return
    try:
        store = SessionStore(state if state == MEMORY else Path(state).expanduser())
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        yield store
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()


def _find(store: SessionStore | None, session_id: str, agent: str | None) -> SessionRecord:
    if store is None:
        matches = []
    elif agent is not None:
        # Listed rather than read: a damaged row is still shown (and can be forgotten).
        matches = [r for r in store.list(agent) if r.session_id == session_id]
    else:
        matches = [r for r in store.list() if r.session_id == session_id]
    if not matches:
        scope = f" of {agent}" if agent is not None else ""
        raise click.ClickException(f"No stored session {session_id}{scope}.")
    if len(matches) > 1:
        agents = ", ".join(sorted(r.agent for r in matches))
        raise click.ClickException(
            f"Session {session_id} is stored for several agents ({agents}); "
            "choose one with --agent."
        )
    return matches[0]


def _printable(text: str) -> str:
    """``text`` as output can take it: a lone surrogate (valid in JSON, so possible in an
    id or agent name, but not text) as its ``\\uXXXX`` escape, which in JSON output reads
    back as the same value."""
    return text.encode("utf-8", "backslashreplace").decode()


def _mode(record: SessionRecord) -> str:
    if record.damaged is not None:
        return "damaged"
    return "default" if record.prompt is None else record.prompt.mode


def _summary(record: SessionRecord) -> dict[str, Any]:
    """A session as JSON, without the prompt text."""
    prompt = record.prompt
    return {
        "agent": record.agent,
        "sessionId": record.session_id,
        "mode": _mode(record),
        "live": record.live,
        "parentId": record.parent_id,
        "fingerprint": None if prompt is None else prompt.fingerprint(),
        "delivered": record.delivered,
        "createdAt": _utc_time(record.created_at),
        "updatedAt": _utc_time(record.updated_at),
        **({"damaged": record.damaged} if record.damaged is not None else {}),
    }


def _local_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _utc_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="seconds")
