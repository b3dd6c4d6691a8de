"""A clean stop ends with no thread able to write: finished helpers are joined, a daemon still running is
named and silenced (a thread writing during interpreter shutdown is a fatal error in CPython)."""

import logging
import threading

from dispatch_app.runtime.quiesce import quiesce


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_finished_threads_are_joined_and_a_still_running_daemon_is_named_and_silenced():
    stop = threading.Event()
    wrote_after = threading.Event()
    quiet = threading.Event()
    chatty_log = logging.getLogger("tests.chatty")

    def short():
        pass

    def chatty():
        while not stop.is_set():
            if quiet.is_set() and chatty_log.isEnabledFor(logging.WARNING):
                wrote_after.set()
            chatty_log.warning("still here")
            stop.wait(0.01)

    done = threading.Thread(target=short, name="short-lived")
    running = threading.Thread(target=chatty, name="chatty-daemon", daemon=True)
    done.start()
    running.start()
    try:
        # (not caplog.at_level: it resets logging.disable on exit, which is what is asserted below)
        runtime_log, collect = logging.getLogger("dispatch_app.runtime"), Collect()
        level = runtime_log.level
        runtime_log.addHandler(collect)
        runtime_log.setLevel(logging.INFO)
        try:
            alive = quiesce(deadline=0.2)
        finally:
            runtime_log.removeHandler(collect)
            runtime_log.setLevel(level)
        quiet.set()
        assert "chatty-daemon" in alive and "short-lived" not in alive
        assert not done.is_alive()
        assert any("chatty-daemon" in m for m in collect.messages)
        assert logging.root.manager.disable >= logging.CRITICAL  # nothing logs any more
        assert not wrote_after.wait(0.1)
    finally:
        logging.disable(logging.NOTSET)
        stop.set()
        running.join(5)
