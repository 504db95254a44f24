"""Session lifecycle state for one bridge connection, backed by the durable store.

What changes and when is decided by :mod:`acp_bridge.core.sessions`, which hands the
runtime its store writes as values; this class carries them out (:meth:`Lifecycle.apply`,
called off the event loop) and binds the store to the agent identity, which is known once
``initialize`` returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from acp_bridge.core.sessions import Forget, MarkClosed, SaveSession, SetDelivered, StoreWrite
from acp_bridge.core.system_prompt import SystemPrompt
from acp_bridge.state.store import SessionRecord, SessionStore


class Lifecycle:
    def __init__(self, store: SessionStore, agent: str) -> None:
        self.store = store
        self.agent = agent

    @classmethod
    def for_command(cls, store: SessionStore, argv: Sequence[str]) -> Lifecycle:
        """Keyed by the command's name until ``initialize`` tells the agent's own name."""
        return cls(store, Path(argv[0]).name)

    def apply(self, *writes: StoreWrite) -> None:
        """Carry out the writes the session table asked for, in order; raises
        ``StoreError`` at the first that fails."""
        for write in writes:
            if isinstance(write, SaveSession):
                save = self.save_new if write.new_conversation else self.save
                save(write.session_id, write.prompt, parent_id=write.parent_id)
            elif isinstance(write, MarkClosed):
                self.set_live(write.session_id, False)
            elif isinstance(write, SetDelivered):
                self.set_delivered(write.session_id, write.fingerprint)
            elif isinstance(write, Forget):
                self.forget(write.session_id)

    def get(self, session_id: str) -> SessionRecord | None:
        return self.store.get(self.agent, session_id)

    def save(
        self, session_id: str, prompt: SystemPrompt | None, *, parent_id: str | None = None
    ) -> None:
        self.store.put(self.agent, session_id, prompt, live=True, parent_id=parent_id)

    def save_new(
        self, session_id: str, prompt: SystemPrompt | None, *, parent_id: str | None = None
    ) -> None:
        """A session the agent has just created (``session/new``, ``session/fork``): its
        conversation starts now, even if the agent reused the id of an older one (agents
        that number sessions per process do after a restart), so nothing stored for that id
        (what was delivered into it, its parent) carries over."""
        self.store.put(
            self.agent, session_id, prompt, live=True, parent_id=parent_id, new_conversation=True
        )

    def set_live(self, session_id: str, live: bool) -> None:
        self.store.set_live(self.agent, session_id, live)

    def set_delivered(self, session_id: str, fingerprint: str | None) -> None:
        self.store.set_delivered(self.agent, session_id, fingerprint)

    def forget(self, session_id: str) -> None:
        self.store.forget(self.agent, session_id)
