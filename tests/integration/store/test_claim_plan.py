"""The claim query on a big outbox reads the claim indexes in order: no Sort, no scan of dispatched rows,
and no walk over pending rows that are not yet available (leased, backed off, scheduled). First attempts and
later ones (re-dispatches) each come from their own partial index; the later ones only top a short batch up. Its
next-due probe reads at most one row of each."""

import json
import uuid

import pytest
from django.db import connection

from dispatch_app.db.prepared import DISPATCHER_SESSION
from dispatch_app.store.claim import AGAIN_PER_CLAIM, CLAIM_SQL, ENVELOPE, JOB, claim_batch

pytestmark = pytest.mark.django_db

TOTAL = 100_000
PENDING = 2_000  # half available now, half scheduled an hour ahead


def plan_nodes(node, within: tuple[str, ...] = ()):
    """Every node, with the names of the CTEs and sub-plans it runs under in ``node["within"]``."""
    if "Subplan Name" in node:
        within = (*within, node["Subplan Name"])
    node["within"] = within
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child, within)


def explain(cursor, options: str, limit: int) -> list[dict]:
    # The dispatcher runs the claim in a session set up this way (dispatch_app.db.prepared); SET LOCAL: this test only.
    for statement in DISPATCHER_SESSION:
        cursor.execute(statement.replace("SET ", "SET LOCAL ", 1))
    cursor.execute(
        f"EXPLAIN ({options}, FORMAT JSON) " + CLAIM_SQL,
        {"limit": limit, "lease": 30, "token": str(uuid.uuid4()), "again_limit": AGAIN_PER_CLAIM, "writer_grace": 2.0},
    )
    raw = cursor.fetchone()[0]
    return list(plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))


@pytest.fixture
def big_outbox():
    with connection.cursor() as cursor:
        # Set-based inserts: seconds, not minutes. Most of the outbox is history.
        cursor.execute(
            f"INSERT INTO {JOB} (domain, status, attempt, payload, error, vendor_request_id) "
            "SELECT 'delivery', 'succeeded', 1, '{}'::jsonb, '', '' FROM generate_series(1, %s)",
            [TOTAL],
        )
        cursor.execute(
            f"INSERT INTO {ENVELOPE} (job_id, attempt, domain, queue, status, available_at, "
            "send_attempts, last_error, created_at, dispatched_at) "
            "SELECT id, 1, 'delivery', 'delivery', "
            "CASE WHEN id %% %(every)s = 0 THEN 'pending' ELSE 'dispatched' END, "
            "CASE WHEN id %% (2 * %(every)s) = 0 THEN clock_timestamp() + interval '1 hour' "
            "ELSE clock_timestamp() - make_interval(secs => id %% 5000) END, "
            "1, '', clock_timestamp(), clock_timestamp() "
            f"FROM {JOB}",
            {"every": TOTAL // PENDING},
        )
        cursor.execute(
            f"SELECT status, count(*) FILTER (WHERE available_at <= now()), count(*) FROM {ENVELOPE} GROUP BY status"
        )
        counts = {status: (now, total) for status, now, total in cursor.fetchall()}
        assert counts["pending"] == (PENDING // 2, PENDING)
        assert counts["dispatched"][1] == TOTAL - PENDING
        cursor.execute(f"ANALYZE {JOB}")
        cursor.execute(f"ANALYZE {ENVELOPE}")
        yield cursor


def envelope_scans(nodes: list[dict]) -> list[dict]:
    """Scans of the outbox, except the update's own lookup by primary key."""
    return [
        n
        for n in nodes
        if n.get("Relation Name") == ENVELOPE and "Scan" in n["Node Type"] and n.get("Index Name") != f"{ENVELOPE}_pkey"
    ]


def claim_scans(nodes: list[dict]) -> list[dict]:
    """The scans that pick candidates."""
    return [n for n in envelope_scans(nodes) if "CTE next_due" not in n["within"]]


def next_due_scans(nodes: list[dict]) -> list[dict]:
    return [n for n in envelope_scans(nodes) if "CTE next_due" in n["within"]]


def test_claim_reads_the_claim_index_in_order_and_stops_at_the_clock_bound(big_outbox):
    nodes = explain(big_outbox, "COSTS OFF", 100)
    kinds = [n["Node Type"] for n in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    scans = claim_scans(nodes)
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [
        ("Index Scan", "envelope_claim_first"),
        ("Index Scan", "envelope_claim_again"),
    ], scans
    # The clock bound is an index condition, not a per-row filter...
    for scan in scans:
        assert "available_at" in scan.get("Index Cond", ""), scan

    # ...so a short batch (asking for more than is available) stops at the bound instead
    # of filtering its way through the 1,000 scheduled rows behind it.
    nodes = explain(big_outbox, "ANALYZE, COSTS OFF, TIMING OFF", PENDING)
    first, again = claim_scans(nodes)
    assert first["Actual Rows"] == PENDING // 2
    assert first.get("Rows Removed by Filter", 0) == 0, first
    assert (again["Actual Rows"], again.get("Rows Removed by Filter", 0)) == (0, 0), again


def test_a_storm_of_due_redispatches_keeps_both_halves_in_index_order(big_outbox):
    # Recovery re-dispatched half of the due envelopes (a later attempt each, due now), and the
    # statistics know: the planner must still read both partial indexes in order, never Sort the storm.
    big_outbox.execute(
        f"UPDATE {ENVELOPE} SET attempt = 2 WHERE status = 'pending' AND available_at <= now() AND job_id % 200 = 50"
    )
    big_outbox.execute(
        f"SELECT count(*) FROM {ENVELOPE} WHERE status = 'pending' AND attempt = 2 AND available_at <= now()"
    )
    again_due = big_outbox.fetchone()[0]
    assert 0 < again_due < PENDING // 2
    big_outbox.execute(f"ANALYZE {ENVELOPE}")
    nodes = explain(big_outbox, "ANALYZE, COSTS OFF, TIMING OFF", 100)
    kinds = [n["Node Type"] for n in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    first, again = claim_scans(nodes)
    assert (first["Index Name"], first["Actual Rows"]) == ("envelope_claim_first", 100), first
    assert (again["Index Name"], again["Actual Loops"]) == ("envelope_claim_again", 0), again  # a full batch

    # The explained claim took 100 first attempts; every other one goes before any re-dispatch.
    claimed = []
    while batch := claim_batch(100, 30).envelopes:
        claimed += [e.attempt for e in batch]
    assert claimed == [1] * (PENDING // 2 - again_due - 100) + [2] * again_due


def test_next_due_probe_reads_at_most_one_row_of_each_claim_index(big_outbox):
    nodes = explain(big_outbox, "ANALYZE, COSTS OFF, TIMING OFF", 100)
    first, again = next_due_scans(nodes)
    assert (first["Index Name"], again["Index Name"]) == ("envelope_claim_first", "envelope_claim_again")
    for probe in (first, again):
        assert "available_at" in probe.get("Index Cond", ""), probe
    # min() over each index: the first row past the clock bound, not the 1,000 scheduled rows.
    assert first["Actual Rows"] == 1, first
    assert again["Actual Rows"] == 0, again  # no later attempt is scheduled


def test_the_generic_plan_of_the_prepared_claim_reads_both_indexes_in_order(big_outbox):
    # The claim runs prepared (dispatch_app.db.prepared); after five executions PostgreSQL keeps a generic plan,
    # made without the batch size or the clock. That plan too must read the indexes in order, never Sort.
    sql = CLAIM_SQL.replace("%(limit)s", "$1::int").replace("%(lease)s", "$2::float8").replace("%(token)s", "$3::uuid")
    sql = sql.replace("%(again_limit)s", "$4::int").replace("%(writer_grace)s", "$5::float8")
    for statement in DISPATCHER_SESSION:
        big_outbox.execute(statement.replace("SET ", "SET LOCAL ", 1))
    big_outbox.execute("PREPARE pf_claim_probe AS " + sql)
    big_outbox.execute(f"EXPLAIN (FORMAT JSON) EXECUTE pf_claim_probe(100, 30, '{uuid.uuid4()}', {AGAIN_PER_CLAIM}, 2)")
    raw = big_outbox.fetchone()[0]
    nodes = list(plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    kinds = [n["Node Type"] for n in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    assert [(n["Node Type"], n.get("Index Name")) for n in claim_scans(nodes)] == [
        ("Index Scan", "envelope_claim_first"),
        ("Index Scan", "envelope_claim_again"),
    ]
    big_outbox.execute("DEALLOCATE pf_claim_probe")
