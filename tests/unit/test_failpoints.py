"""The note failpoint: a child process tells a test that a step has begun."""

import os
import threading

import pytest

from dispatch_app.config import failpoints


def test_a_note_appends_one_line_per_hit_with_the_pid_across_threads(monkeypatch, tmp_path):
    notes = tmp_path / "notes"
    monkeypatch.setattr(failpoints, "ACTIVE", frozenset({"note_step"}))
    monkeypatch.setenv("PRODUCTFLOW_FAILPOINT_NOTES", str(notes))
    threads = [threading.Thread(target=lambda: [failpoints.hit("note_step") for _ in range(50)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    failpoints.hit("note_other")  # not switched on: no line

    assert notes.read_text().splitlines() == [f"note_step {os.getpid()}"] * 200


def test_a_note_without_a_file_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(failpoints, "ACTIVE", frozenset({"note_step"}))
    monkeypatch.delenv("PRODUCTFLOW_FAILPOINT_NOTES", raising=False)
    with pytest.raises(RuntimeError, match="note_step: PRODUCTFLOW_FAILPOINT_NOTES"):
        failpoints.hit("note_step")
