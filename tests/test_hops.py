"""The hops of one connection and where each session lives, without a router around them."""

from __future__ import annotations

from acp_bridge.core.hops import PRIMARY, Hops


def prompt(session_id: object) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/prompt",
        "params": {"sessionId": session_id},
    }


def test_a_message_goes_to_the_hop_its_session_was_last_placed_in() -> None:
    hops = Hops()
    first, second = hops.add(), hops.add()
    hops.place("s", first)
    assert hops.hop_for(prompt("s")) == first
    hops.place("s", second)
    assert hops.hop_for(prompt("s")) == second
    hops.place("s", PRIMARY)
    assert hops.hop_for(prompt("s")) == PRIMARY
    hops.place("t", second)
    hops.unplace("t")
    assert hops.hop_for(prompt("t")) == PRIMARY


def test_a_message_naming_no_session_goes_to_the_primary() -> None:
    hops = Hops()
    hops.place("s", hops.add())
    assert hops.hop_for(prompt("other")) == PRIMARY
    assert hops.hop_for(prompt(7)) == PRIMARY
    assert hops.hop_for({"jsonrpc": "2.0", "id": 1, "method": "session/list"}) == PRIMARY
    assert hops.hop_for({"jsonrpc": "2.0", "id": 1, "method": "x", "params": ["s"]}) == PRIMARY


def test_a_gone_process_forgets_its_sessions_and_its_number_is_not_given_again() -> None:
    hops = Hops()
    gone, kept = hops.add(), hops.add()
    hops.place("s", gone)
    hops.place("k", kept)
    state = hops.close(gone, 3)
    assert (state.closed, state.status) == (True, 3) and hops[gone] is state
    assert hops.hop_for(prompt("s")) == PRIMARY
    assert hops.hop_for(prompt("k")) == kept
    hops.place("late", gone)  # placed after its process ended: still the primary
    assert hops.hop_for(prompt("late")) == PRIMARY
    assert hops.add() == kept + 1 and len(hops) == 4
