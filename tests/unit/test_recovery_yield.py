"""A recovery round yields to new work: it waits while the outbox has a backlog, at most its bound (injected clock)."""

import threading

from dispatch_app.runtime.yielding import YieldingWait


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stop(threading.Event):
    """A stop signal whose waits pass instantly and advance the injected clock instead."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock
        self.waited: list[float] = []

    def wait(self, timeout=None) -> bool:
        self.waited.append(timeout)
        self.clock.now += timeout or 0.0
        return self.is_set()


def backlog_for(answers: list[bool]):
    seen = []

    def backlog() -> bool:
        seen.append(True)
        return answers.pop(0) if answers else False

    return backlog, seen


def test_no_backlog_the_round_starts_after_its_pause_with_one_look():
    clock = Clock()
    stop = Stop(clock)
    backlog, looks = backlog_for([False])
    wait = YieldingWait(stop, max_yield=1.0, backlog=backlog, check_interval=0.025, clock=clock)
    assert wait(0.5) is False
    assert stop.waited == [0.5] and len(looks) == 1
    assert (wait.yields, wait.yielded_seconds) == (0, 0.0)


def test_a_backlog_holds_the_round_until_it_is_gone():
    clock = Clock()
    stop = Stop(clock)
    backlog, looks = backlog_for([True, True, True, False])
    wait = YieldingWait(stop, max_yield=1.0, backlog=backlog, check_interval=0.025, clock=clock)
    assert wait(0.5) is False
    assert stop.waited == [0.5, 0.025, 0.025, 0.025]
    assert wait.yields == 1 and abs(wait.yielded_seconds - 0.075) < 1e-9


def test_a_backlog_that_never_clears_holds_the_round_for_at_most_max_yield():
    clock = Clock()
    stop = Stop(clock)
    wait = YieldingWait(stop, max_yield=1.0, backlog=lambda: True, check_interval=0.025, clock=clock)
    assert wait(0.0) is False
    assert 1.0 <= wait.yielded_seconds < 1.0 + 0.025 + 1e-9


def test_stop_while_yielding_returns_stop_at_once():
    clock = Clock()
    stop = Stop(clock)

    def backlog() -> bool:
        stop.set()  # stopped while it looks: the next wait reports it
        return True

    wait = YieldingWait(stop, max_yield=1.0, backlog=backlog, check_interval=0.025, clock=clock)
    assert wait(0.5) is True
    assert stop.waited == [0.5, 0.025]


def test_stop_during_the_pause_does_not_look_at_the_outbox():
    clock = Clock()
    stop = Stop(clock)
    stop.set()
    backlog, looks = backlog_for([True])
    assert YieldingWait(stop, max_yield=1.0, backlog=backlog, clock=clock)(0.5) is True
    assert looks == []
