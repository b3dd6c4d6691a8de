"""The capacity-one wake channel: signals collapse, a wake during a scan means one more scan."""

import threading

from dispatch_app.dispatch.wake import CATCH_UP, NOTIFY, STOP, TICK, Wake


def test_timeout_without_a_signal_is_a_tick():
    wake = Wake()
    assert wake.wait(0) == TICK
    assert not wake.is_set()


def test_a_burst_of_signals_collapses_into_one_wake():
    wake = Wake()
    for _ in range(100):
        wake.set(NOTIFY)
    assert wake.signals == 100
    assert wake.wait(0) == NOTIFY
    # Taken: the next wait finds nothing pending.
    assert not wake.is_set()
    assert wake.wait(0) == TICK


def test_an_announced_reason_wins_over_a_tick_and_the_first_announcement_is_kept():
    wake = Wake()
    wake.set(TICK)
    wake.set(NOTIFY)
    wake.set(CATCH_UP)
    assert wake.wait(0) == NOTIFY


def test_a_signal_while_a_scan_runs_leaves_exactly_one_pending_wake():
    wake = Wake()
    wake.set(NOTIFY)
    assert wake.wait(0) == NOTIFY  # the scan starts here
    wake.set(NOTIFY)  # ...arrives during the scan
    wake.set(NOTIFY)
    assert wake.wait(0) == NOTIFY  # one more scan
    assert wake.wait(0) == TICK  # and no third


def test_set_from_another_thread_releases_a_blocked_waiter():
    wake = Wake()
    entered = threading.Event()
    got = []

    def waiter():
        entered.set()
        got.append(wake.wait(60))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert entered.wait(10)
    wake.set(STOP)
    thread.join(10)
    assert not thread.is_alive()
    assert got == [STOP]


def test_only_named_holds_only_while_nothing_else_came():
    wake = Wake()
    wake.set(NOTIFY, named=True)
    wake.set(NOTIFY, named=True)
    assert (wake.wait(0), wake.only_named) == (NOTIFY, True)
    assert (wake.wait(0), wake.only_named) == (TICK, False), "taken with its wake"
    for other in (NOTIFY, TICK, CATCH_UP):
        wake.set(NOTIFY, named=True)
        wake.set(other)
        assert (wake.wait(0), wake.only_named) == (NOTIFY, False), f"{other} after it asks for a scan"
        wake.set(other)
        wake.set(NOTIFY, named=True)
        # (a NOTIFY takes a tick's place, as ever; either way the wake is a scan)
        assert wake.wait(0) in (other, NOTIFY) and not wake.only_named, f"it keeps the scan {other} asked for"
