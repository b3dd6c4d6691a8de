"""The claim query on a big outbox reads the claim index in order: no Sort, no scan of dispatched rows,
and no walk over pending rows that are not yet available (leased, backed off, scheduled). Its next-due
probe reads one row of the same index."""

import json
import uuid

import pytest
from django.db import connection

from dispatch_app.dispatch.claim import CLAIM_SQL, ENVELOPE, JOB

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
    cursor.execute(
        f"EXPLAIN ({options}, FORMAT JSON) " + CLAIM_SQL, {"limit": limit, "lease": 30, "token": str(uuid.uuid4())}
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
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [("Index Scan", "envelope_claim")], scans
    # The clock bound is an index condition, not a per-row filter...
    assert "available_at" in scans[0].get("Index Cond", ""), scans[0]

    # ...so a short batch (asking for more than is available) stops at the bound instead
    # of filtering its way through the 1,000 scheduled rows behind it.
    nodes = explain(big_outbox, "ANALYZE, COSTS OFF, TIMING OFF", PENDING)
    (scan,) = claim_scans(nodes)
    assert scan["Actual Rows"] == PENDING // 2
    assert scan.get("Rows Removed by Filter", 0) == 0, scan


def test_next_due_probe_reads_one_row_of_the_claim_index(big_outbox):
    nodes = explain(big_outbox, "ANALYZE, COSTS OFF, TIMING OFF", 100)
    (probe,) = next_due_scans(nodes)
    assert probe["Index Name"] == "envelope_claim", probe
    assert "available_at" in probe.get("Index Cond", ""), probe
    # min() over the index: the first row past the clock bound, not the 1,000 scheduled rows.
    assert probe["Actual Rows"] == 1, probe
