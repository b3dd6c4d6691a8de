"""``manage.py dispatchstats`` escapes what it prints (issue 56.6): a worker hash, a dispatcher's name, a loop's and
a recovery round's error and a domain name holding terminal escape sequences (ESC, BEL, CSI, bidi overrides, a
newline) are shown as ``\\x1b``-style escapes, never raw, and none of them starts a line of its own."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command

from dispatch_app.config.tuning import FAILING_STREAK
from dispatch_app.management.commands.dispatchstats import terminal_safe
from dispatch_app.models import DispatcherProcess, LoopHeartbeat, RecoveryRound
from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.fields import LAST_ERROR_FIELD, RECENT_FIELD
from tests.integration.opsdata import envelope, job

pytestmark = pytest.mark.django_db

CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
TITLE = "\x1b]0;pwned\x07"  # set the terminal's title (OSC ... BEL)
CSI = "\x9b31m"  # the one-byte CSI (C1)
BIDI = "\u202egnp.exe"
NAME = "w" + CLEAR + "orker"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def hostile_worker(redis_conn):
    key = rq_internals.worker_key_prefix() + NAME
    redis_conn.hset(
        key,
        mapping={
            "state": "busy\nFAKE LINE" + TITLE,
            "queues": "delivery," + CSI,
            "hostname": "h" + BIDI,
            "successful_job_count": "0",
            "failed_job_count": str(FAILING_STREAK),
            RECENT_FIELD: "f" * FAILING_STREAK,  # failing every job: its last error is printed too
            LAST_ERROR_FIELD: "boom" + CLEAR + TITLE,
        },
    )
    redis_conn.sadd("rq:workers", key)
    redis_conn.sadd(rq_internals.workers_of_queue_key("delivery"), key)
    return key


def test_terminal_safe_shows_every_control_character_as_an_escape():
    assert terminal_safe(CLEAR + TITLE + CSI + BIDI + "\n\té") == (
        "\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07\\x9b31m\\u202egnp.exe\\x0a\\x09é"
    )


def test_dispatchstats_prints_no_escape_sequence_from_redis_or_the_database(hostile_worker):
    envelope(job("evil" + CLEAR), "pending", created_ago=5)  # a domain name only the database knows
    process = DispatcherProcess.objects.create(name="d" + TITLE, hostname="h" + CLEAR, pid=1)
    LoopHeartbeat.objects.create(process=process, loop="dispatch" + CSI, errors=1, last_error="e" + CLEAR)
    RecoveryRound.objects.create(domain="delivery", scanned=1, error="round failed" + CLEAR + "\nFAKE LINE")

    out = io.StringIO()
    call_command("dispatchstats", stdout=out)
    text = out.getvalue()

    assert not RAW.search(text), [line for line in text.splitlines() if RAW.search(line)]
    # Each hostile value is there, escaped: from the worker hash ...
    assert "w\\x1b[2J\\x1b[Horker" in text and "busy\\x0aFAKE LINE\\x1b]0;pwned\\x07" in text
    assert "delivery,\\x9b31m" in text and "last error: boom\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07" in text
    # ... and from the database.
    assert "evil\\x1b[2J\\x1b[H" in text and "d\\x1b]0;pwned\\x07" in text and "dispatch\\x9b31m" in text
    assert "round failed\\x1b[2J\\x1b[H\\x0aFAKE LINE" in text
    # A newline in a value starts no line of its own.
    assert not [line for line in text.splitlines() if line.lstrip().startswith("FAKE LINE")]


def test_dispatchstats_json_keeps_the_values_and_escapes_them_as_json(hostile_worker):
    out = io.StringIO()
    call_command("dispatchstats", "--json", stdout=out)
    raw = out.getvalue()
    assert not RAW.search(raw.replace("\n", ""))
    workers = json.loads(raw)["workers"]["workers"]
    assert [w["state"] for w in workers if w["name"] == NAME] == ["busy\nFAKE LINE" + TITLE]
