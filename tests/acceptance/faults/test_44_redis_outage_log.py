"""Scenario 44: a Redis outage is a handful of log lines, not a traceback per round (issue 29 item 3).

A dispatcher with its recovery child and every domain's recovery loop busy
(stale queued jobs in every domain, whose evidence is read from Redis, a round
every 0.5 s), Redis stopped for OUTAGE seconds (``PF_FAULTS_OUTAGE_SECONDS``,
default 10; the issue's case is 60), then started again. Every recovery round
fails meanwhile; the dispatcher's log (its own and its recovery child's lines)
has the first failure of each kind with its traceback, a "still failing"
summary at most every 30 s, and one line when it ends: a bounded handful,
where it used to be two tracebacks per round per domain.
"""

import json
import os
import re
import time

import pytest

from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

OUTAGE = float(os.environ.get("PF_FAULTS_OUTAGE_SECONDS") or 10)
DOMAINS = ("workflow", "delivery", "image_series", "partial_edit", "agent")
PERIOD = 0.5
RECOVERY = {
    domain: {"QUEUED_STALE_SECONDS": 0.5, "PERIOD_SECONDS": PERIOD, "JITTER_SECONDS": 0, "MAX_ATTEMPTS": 1000}
    for domain in DOMAINS
}
# A log record's first line: "<date> <time> <LEVEL> <logger> ...".
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (WARNING|ERROR|CRITICAL) ", re.MULTILINE)
# The lines about it: one per failure kind (traceback), one summary per 30 s, one when it ends, per process.
HANDFUL = 12 + 2 * int(OUTAGE // 30)


def test_a_redis_outage_leaves_a_handful_of_log_lines(private_redis_stack, private_redis):
    stack = private_redis_stack
    dispatcher = stack.dispatcher(
        "--poll-interval",
        "0.5",
        recovery=True,
        DISPATCH_RECOVERY=json.dumps(RECOVERY),
        **short_redis_timeouts(stack.redis_url, 0.5),
    )
    for domain in DOMAINS:
        stack.submit(2, domain=domain, prefix=f"s44-{domain}")
    stack.wait_all("queued", 2 * len(DOMAINS), timeout=60)  # no worker: they stay queued, recovery's candidates
    wait_until(
        lambda: (
            stack.scalar("SELECT count(DISTINCT domain) FROM dispatch_app_recoveryround WHERE scanned > 0")
            == len(DOMAINS)
        ),
        timeout=30,
        message="every domain's recovery looking at its stale jobs",
    )
    before = len(dispatcher.output())

    private_redis.stop()
    down_since = time.monotonic()
    down_at = stack.scalar("SELECT clock_timestamp()")
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count(DISTINCT domain) FROM dispatch_app_recoveryround WHERE started_at > %s AND error <> ''",
                [down_at],
            )
            == len(DOMAINS)
        ),
        timeout=30,
        message="every domain's rounds failing",
    )
    # The outage's length is the scenario itself, not a wait for an effect.
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_since)))
    failed_rounds = stack.scalar(
        "SELECT count(*) FROM dispatch_app_recoveryround WHERE started_at > %s AND error <> ''", [down_at]
    )
    private_redis.start()
    up_at = stack.scalar("SELECT clock_timestamp()")
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count(DISTINCT domain) FROM dispatch_app_recoveryround "
                "WHERE started_at > %s AND finished_at IS NOT NULL AND error = ''",
                [up_at],
            )
            == len(DOMAINS)
        ),
        timeout=60,
        message="every domain's rounds succeeding again",
    )
    wait_until(lambda: "no longer failing" in dispatcher.output()[before:], timeout=10, message="the incident's end")
    assert dispatcher.stop() == 0, dispatcher.output()[-4000:]

    about_it = dispatcher.output()[before:]
    records = RECORD.findall(about_it)
    tracebacks = about_it.count("Traceback (most recent call last)")
    print(f"\n{len(records)} warning/error records, {tracebacks} tracebacks over {failed_rounds} failed rounds")
    assert failed_rounds >= 2 * len(DOMAINS), failed_rounds
    assert len(records) <= HANDFUL, about_it[-6000:]
    assert tracebacks <= HANDFUL // 2, about_it[-6000:]
    record_figures(
        "44_redis_outage_log",
        outage_seconds=OUTAGE,
        failed_recovery_rounds=failed_rounds,
        warning_or_error_records=len(records),
        tracebacks=tracebacks,
        bound=HANDFUL,
    )
