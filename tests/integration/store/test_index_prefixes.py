"""No index of ours is the leading part of another on the same table: every write would pay for an entry nothing reads.

Read from the migrated test database's catalog (``pg_index``), so an index a model, a migration or a foreign key
adds is judged as PostgreSQL holds it. A plain (non-unique, whole-table, column-only) btree index whose columns are
the first columns of another btree index with the same predicate is redundant: the longer one serves every lookup the
shorter one could (migration 0019 dropped three such foreign-key indexes).
"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

INDEXES_SQL = """
SELECT t.relname, i.relname,
       ARRAY(SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.ord),
       x.indisunique, pg_get_expr(x.indpred, x.indrelid),
       x.indexprs IS NOT NULL, am.amname
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
JOIN pg_am am ON am.oid = i.relam
WHERE n.nspname = current_schema() AND t.relname LIKE 'dispatch\\_app\\_%%'
"""


def redundant_indexes(rows) -> list[str]:
    found = []
    for table, name, keys, unique, predicate, expressions, method in rows:
        if unique or expressions or method != "btree":
            continue
        for other_table, other, other_keys, _, other_predicate, other_expressions, other_method in rows:
            if (other_table, other) == (table, name) or other_table != table or other_method != "btree":
                continue
            if other_expressions or other_predicate != predicate:
                continue
            if len(other_keys) > len(keys) and list(other_keys[: len(keys)]) == list(keys):
                found.append(f"{table}.{name} {list(keys)} is the start of {other} {list(other_keys)}")
    return found


def test_no_index_is_the_leading_part_of_another():
    with connection.cursor() as cursor:
        cursor.execute(INDEXES_SQL)
        rows = cursor.fetchall()
    tables = {row[0] for row in rows}
    assert {"dispatch_app_job", "dispatch_app_vendorcall", "dispatch_app_jobevent"} <= tables
    assert redundant_indexes(rows) == []


def test_the_check_finds_a_foreign_key_index_under_a_composite():
    # The shape 0019 removed, put back for this test only (rolled back with it).
    with connection.cursor() as cursor:
        cursor.execute('CREATE INDEX "probe_vendorcall_job" ON dispatch_app_vendorcall (job_id)')
        cursor.execute(INDEXES_SQL)
        rows = cursor.fetchall()
    assert redundant_indexes(rows) == [
        "dispatch_app_vendorcall.probe_vendorcall_job ['job_id'] is the start of vendorcall_job_seq "
        "['job_id', 'seq', 'id']"
    ]
