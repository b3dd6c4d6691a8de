"""BoundedSender: the slot is taken before a thread gets work; counts are exact under concurrency."""

import threading

import pytest

from dispatch_app.dispatch.sender import BoundedSender


class Gate:
    """A send that records how many run at once and blocks until released."""

    def __init__(self):
        self.release = threading.Event()
        self.arrived = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.calls = 0

    def send(self, item):
        with self._lock:
            self.running += 1
            self.calls += 1
            self.peak = max(self.peak, self.running)
        self.arrived.release()
        try:
            assert self.release.wait(30), "the test never released the gate"
            return item
        finally:
            with self._lock:
                self.running -= 1


def hold_k(gate: Gate, sender: BoundedSender, k: int) -> None:
    """Wait until K sends are in the gate, and check the sender counts them."""
    for _ in range(k):
        assert gate.arrived.acquire(timeout=10)
    assert gate.running == k
    assert sender.in_flight == k


def test_capacity_k_holds_the_submitter_and_starts_no_more_than_k_threads():
    k, n = 4, 40
    sender = BoundedSender(k, name="test-send")
    gate = Gate()
    pulled = []

    def items():
        for i in range(n):
            pulled.append(i)
            yield i

    returned = threading.Event()
    results = []

    def submitter():
        results.extend(sender.map(gate.send, items()))
        returned.set()

    thread = threading.Thread(target=submitter)
    thread.start()
    try:
        # K sends are held: the submitter cannot have handed out more work.
        hold_k(gate, sender, k)
        assert not returned.is_set()
        # It took at most the one item it is now waiting to find a slot for.
        assert len(pulled) <= k + 1
        assert sender._work.qsize() == 0  # nothing piled up behind the limit
        assert sender.threads_started <= k
    finally:
        gate.release.set()
        thread.join(30)
    assert returned.is_set()
    assert [o.value for o in results] == list(range(n))
    assert gate.peak <= k
    assert sender.peak_in_flight == k
    assert sender.in_flight == 0
    assert sender.threads_started <= k
    sender.close()


def test_counts_are_exact_over_many_concurrent_sends_with_failures():
    k, n = 8, 2_000
    sender = BoundedSender(k, name="test-send")
    lock = threading.Lock()
    running = {"now": 0, "peak": 0}

    def send(item):
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        try:
            if item % 7 == 0:
                raise ConnectionError(f"send {item} failed")
            return 1
        finally:
            with lock:
                running["now"] -= 1

    # Several submitters share one sender, as batches of different loops could.
    barrier = threading.Barrier(4)
    outcomes: list[list] = [[] for _ in range(4)]

    def submitter(index):
        barrier.wait()
        outcomes[index] = sender.map(send, range(index, n, 4))

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    flat = [o for batch in outcomes for o in batch]
    assert len(flat) == n
    failed = [o for o in flat if o.error is not None]
    assert len(failed) == len(range(0, n, 7))
    assert all(isinstance(o.error, ConnectionError) for o in failed)
    assert sum(o.value for o in flat if o.ok) == n - len(failed)
    assert running["peak"] <= k
    assert sender.peak_in_flight <= k
    assert sender.in_flight == 0
    assert sender.threads_started <= k
    sender.close()


def test_items_not_started_when_stop_is_set_come_back_skipped():
    sender = BoundedSender(1, name="test-send")
    stop = threading.Event()

    def send(item):
        stop.set()  # the stop arrives while the first send is in flight
        return item

    outcomes = sender.map(send, range(5), stop=stop)
    assert outcomes[0].ok and outcomes[0].value == 0
    assert [o.skipped for o in outcomes[1:]] == [True] * 4
    assert sender.in_flight == 0
    sender.close()


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="send concurrency must be >= 1"):
        BoundedSender(0)


def test_the_last_item_of_a_list_runs_on_the_calling_thread_and_still_holds_a_slot():
    k = 2
    sender = BoundedSender(k, name="test-send")
    where: dict[int, str] = {}

    def send(item):
        where[item] = threading.current_thread().name
        return gate.send(item)

    # One item: no send thread at all.
    gate = Gate()
    gate.release.set()
    assert [o.value for o in sender.map(send, [7])] == [7]
    assert where[7] == threading.current_thread().name
    assert sender.threads_started == 0

    # Three items, K = 2: the first two on send threads; the last waits for a slot, then runs here.
    gate = Gate()
    results = []
    thread = threading.Thread(target=lambda: results.extend(sender.map(send, [0, 1, 2])), name="caller")
    thread.start()
    try:
        hold_k(gate, sender, k)
        assert 2 not in where  # no slot yet: the caller waits like any submitter
    finally:
        gate.release.set()
        thread.join(30)
    assert [o.value for o in results] == [0, 1, 2]
    assert where[2] == "caller"
    assert {where[0], where[1]} <= {"test-send_0", "test-send_1"}
    assert gate.peak <= k
    assert sender.in_flight == 0
    sender.close()


def test_a_failing_last_item_is_its_outcome_not_the_callers_exception():
    sender = BoundedSender(1, name="test-send")

    def send(item):
        raise ConnectionError(f"send {item} refused")

    outcomes = sender.map(send, [1])
    assert isinstance(outcomes[0].error, ConnectionError)
    assert sender.in_flight == 0
    sender.close()
