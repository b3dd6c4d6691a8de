"""Tuning: every timing, batch and memory knob the code relies on that is not a setting, in one place.

Settings (``DISPATCH[...]``, documented in the README) are what an operator chooses; these are what the code was
measured to need, each with why its value (docs/benchmarks.md has the runs). A module imports its own by name, so
a test can still set one on the module that reads it. Changing one is a code change: measure it first.
"""

from __future__ import annotations

# --- dispatch_app.dispatch.loop --------------------------------------------------------------------------------------
# Bounds the memory of given-back envelope ids (beyond it, a long outage's backlog may count as missed wake-ups).
MAX_REMEMBERED_GIVE_BACKS = 100_000

# --- dispatch_app.dispatch.announced ---------------------------------------------------------------------------------
# Bounds the memory of the loop's recent claims: forgetting one costs at most one duplicate send (RQ's
# create-if-absent leaves the job alone), never a lost or second run.
MAX_REMEMBERED_CLAIMS = 8192
# Envelopes sent ahead and waiting for their mark (DISPATCH["MARK_AHEAD_DELAY"]) are marked at once when this many
# wait: one statement's arrays stay small, and a burst does not hold its marks for the whole delay.
MARK_AHEAD_MAX = 64

# --- dispatch_app.dispatch.sends -------------------------------------------------------------------------------------
# The first pause probes after this long even when SEND_BACKOFF_BASE is 0 (no busy probing).
MIN_PROBE_BACKOFF = 0.1

# --- dispatch_app.dispatch.arming ------------------------------------------------------------------------------------
# Disarmed and busy: the pause before the next scan, and how many quiet scans in a row (none
# found more than REARM_AT_CLAIMED first attempts) mean idle or a trickle (write-concurrency,
# docs/benchmarks.md).
POLL_LINGER = 0.005
QUIET_SCANS_TO_ARM = 2
# An armed drain that claimed this many first attempts disarms. Measured (lead's A/B, 200 jobs/s, one
# dispatcher): disarming on any second envelope or a wake during the drain flapped into polling and
# raised the outbox p50 from ~8-10 ms to 14-23 ms; at 16+ writers (thousands/s) drains find more.
# Re-dispatches do not count: recovery's rounds commit in bursts, and the writers' notify lock is
# what disarming saves; a storm must not turn the dispatcher deaf to new work.
DISARM_AT_CLAIMED = 4

# --- dispatch_app.store.claim ----------------------------------------------------------------------------------------
# Later attempts per claim: a drain of this many sends is short (one Redis pipeline chunk), and a drain that
# took this many is followed at once by another, which again takes new work first.
AGAIN_PER_CLAIM = 5

# --- dispatch_app.models ---------------------------------------------------------------------------------------------
# Up to this many rows, an insert's NOTIFY names its envelopes (sent ahead of their claim); a bigger one
# announces its domains ("worth a scan"): the payload stays far under NOTIFY's 8000-byte limit.
ANNOUNCE_MAX_ROWS = 8

# --- dispatch_app.dispatch.wake ---------------------------------------------------------------------------------------
# Envelopes named by NOTIFYs the wake keeps until the loop reads them; more than a drain sends at once.
ANNOUNCED_MAX = 1000

# --- dispatch_app.runtime.yielding -----------------------------------------------------------------------------------
# An envelope due for longer than this is a backlog: the dispatcher serves a new one in a few ms.
BACKLOG_GRACE = 0.02
# How often a recovery round waiting for an outbox backlog to clear looks again.
CHECK_INTERVAL = 0.025

# --- dispatch_app.runtime.recovery_process ---------------------------------------------------------------------------
# The child gets this share of the deadline for its own clean stop, so it can report
# its hung loops and exit before the parent has to kill it.
CHILD_DEADLINE_SHARE = 0.8

# --- dispatch_app.runtime.assembly -----------------------------------------------------------------------------------
# How much nicer than the dispatcher the recovery child runs (rundispatcher --recovery-nice).
DEFAULT_NICE = 10

# --- dispatch_app.runtime.incident -----------------------------------------------------------------------------------
# At most one "still failing" line per incident this often (s).
SUMMARY_EVERY = 30.0

# --- dispatch_app.recovery.loop -------------------------------------------------------------------------------------
# A round's re-dispatches are spread over this share of its domain's period (their envelopes due one step after
# another) rather than due at once: a round of 25 recovered jobs run back to back took the CPU from new work on
# the other worker processes (issue 30, fast@100: new work's p99 2.05x with the pacer cutting volume by a third).
# The rest of the period is slack, so a round's last step is due before the next round looks.
RECOVERY_SPREAD_SHARE = 0.8
# ... and over no more than this (s): a long period (a round an hour) must not hold recovered work back for long.
# 30, not 10: at the defaults (a round every 30 s) a 10 s spread sent a round in a third of the period, and new
# work's slowest 1 % at 200/s fell in those 10 s windows (issue 30, defaults@200: p99 1.60x, its slowest 1 % in
# 11-36 distinct seconds of 90 against 49-65 without recovery); over 24 s a round arrives about as evenly as a
# round per second's does.
RECOVERY_SPREAD_MAX = 30.0
# The shortest step between two due times, and their grid: every step is one claim more for the dispatcher (its
# due wake), so a short period is spread over fewer, fuller steps (a round of 25 every second: 7 steps of 4 jobs),
# and every domain's steps fall on the same instants (one claim takes them all: at most 10 due wakes a second).
RECOVERY_SPREAD_STEP = 0.1
# While the pacer holds a domain's rounds out (new work slowed), an INFO line says so at the first such round and
# then at most this often (s), with how many rounds it held out; the round that runs again says so once.
PACED_OUT_REPORT_EVERY = 60.0

# --- dispatch_app.recovery.pacing ------------------------------------------------------------------------------------
# New work's commit -> start is read at this quantile unless told (RECOVERY_PACE_QUANTILE): the tail recovery
# must not grow, not the median.
QUANTILE = 0.99
# Fewer first attempts than this in the window say nothing about headroom: the workers have it.
MIN_SAMPLES = 20
# A look serves every loop of the process this long.
SAMPLE_SECONDS = 1.0
# The baseline rises this much per look, so a lasting heavier load stops reading as congestion (a wait 1.3x the
# quietest within about two minutes at a look a second). 1 % per look forgot a storm's slowdown within 30 s, and a
# round per second at 200/s then re-dispatched 64 jobs a minute per domain against 23 (docs/benchmarks.md, "A
# quietest wait that rises slower").
BASELINE_DRIFT = 0.002
# Without congestion the share grows back by this much of the cap per second (floor to whole in ~18 s), by the
# seconds since the last round, not by rounds: a round per 30 s is back at its cap at once. Rounds closer than
# RECOVERY_PACE_FLOOR_SECONDS grow by this x period / floor seconds while new work is there to slow, so a round per
# second adds recovered jobs per second no faster than a round per 30 s does (Pacer.regrowth).
GROWTH_PER_SECOND = 0.05

# --- dispatch_app.rq.worker.worker -----------------------------------------------------------------------------
# A taken job waits in this worker's hand while the batch-mates before it run, even when another
# worker is idle. So a take is sized for that wait to stay within this budget at the recent job
# duration: a backlog of 1 ms jobs still goes 6 per round trip, while a burst of ~3 ms jobs (a
# dispatcher batch lands on a queue at once) is spread over the idle workers instead of one worker
# taking all 8 and the last waiting ~20 ms. Jobs slower than the budget go one per round trip.
PREFETCH_WAIT_BUDGET = 0.005
# Recent job duration: an exponentially weighted average over roughly the last 1 / weight jobs.
JOB_SECONDS_WEIGHT = 0.2
# A taken job not started within this long goes back to its queue: RQ's maintenance
# fails jobs left in the intermediate list for over a minute.
HOLD_SECONDS = 20.0
# An idle worker's blocking wait for a job, so it checks for its stop and its heartbeat at least this often.
IDLE_WAIT_SECONDS = 1.0
# How often a worker looks for jobs a dead worker took and never started (one script call).
RESCUE_SECONDS = 30.0

# --- dispatch_app.rq.worker.starts -----------------------------------------------------------------------------
# Start-write templates kept per worker ((queue, timeout, busy) each; start_template).
MAX_START_TEMPLATES = 64

# --- dispatch_app.rq.worker.start_template ---------------------------------------------------------------------
# Recordings that straddle a second boundary are taken again (epoch-second offsets would be off by one).
RECORD_TRIES = 5

# --- dispatch_app.rq.worker.launch -----------------------------------------------------------------------------
# A worker spends most of a job waiting for round trips (PostgreSQL, Redis, the vendor): a profile of
# `make demo` at 400 jobs/s had each of the two default workers on the CPU ~20% of its time, the rest
# mostly in psycopg's wait, and the pipeline using 0.7 of the 2 cores while jobs queued. One process per
# core leaves the cores idle during those waits; two per core overlap them (docs/benchmarks.md).
PROCESSES_PER_CORE = 2

# --- dispatch_app.rq.worker.beat -------------------------------------------------------------------------------
# Periods of silence after which the hash expires (the worker counts as dead).
TTL_PERIODS = 6
# ... and never less than this, whatever the heartbeat interval.
MIN_TTL_SECONDS = 3

# --- dispatch_app.rq.state.health -----------------------------------------------------------------------------
# This many failed jobs in a row, and none succeeded since, is "fails every job".
FAILING_STREAK = 5

# --- dispatch_app.rq.worker.reports ---------------------------------------------------------------------------
# Outcomes a worker remembers for "fails every job" (health.FAILING_STREAK of them in a row).
RECENT_OUTCOMES = 20

# --- dispatch_app.rq.state.queues -------------------------------------------------------------------------------------
# The dashboard's reads of Redis give up after this long: a stuck server must not hang the page.
REDIS_TIMEOUT = 2.0
# A PipelineWorker silent for this many of its heartbeat periods is not alive (one late beat is not death).
SILENT_PERIODS = 2.5

# --- dispatch_app.management.commands._migrated ----------------------------------------------------------------------
# A command started with PostgreSQL still coming up waits this long for it before it gives up.
STARTUP_DB_WAIT = 30.0

# --- dispatch_app.db.session_bounds -----------------------------------------------------------------------------
# The bounds our long-running commands give a session of theirs that the project's settings and the server leave
# unbounded: the values this repository's productflow/settings.py gives every session (PG_*_TIMEOUT_MS, README), under
# which the fault suite runs (scenario 7: a lock wait cut, a stuck transaction ended by the server).
SESSION_BOUNDS_MS = {
    "statement_timeout": 30_000,
    "lock_timeout": 5_000,
    "idle_in_transaction_session_timeout": 60_000,
}
SESSION_CONNECT_TIMEOUT = 10  # seconds; libpq's default is to wait as long as the kernel's TCP connect does

# --- dispatch_app.store.triggers.migration_locks ----------------------------------------------------------------------
# A transactional migration of ours waits at most this long for a lock (a shorter lock_timeout the session has is
# kept), then rolls back what it took and tries again after MIGRATION_LOCK_BACKOFF x its try number, seconds: every
# submit, claim and start queues behind a waiting lock request, so an upgrade must never wait long for one.
MIGRATION_LOCK_TIMEOUT_MS = 2_000
MIGRATION_LOCK_TRIES = 5
MIGRATION_LOCK_BACKOFF = 1.0

# --- dispatch_app.recovery.evidence, dispatch_app.rq.state.jobs, dispatch_app.rq.state.order -------------------------
# How far into one of RQ's lists (a queue, its intermediate list) a reader looks for ids, from the head. Redis runs
# one command at a time: an unbounded LPOS on a backlog of a million ids held it 13 ms (a page of jobs or a recovery
# round does dozens), and every send and take waited behind it. Workers take from the head, so a job waiting long
# is near it; one further back is reported as such (not looked for), never as missing.
RQ_LIST_READ_MAX = 5000
