"""PostgreSQL's work per job, from its own statistics: what a job costs the database besides CPU.

Read from the pipeline's database before and after a window (every process of
the pipeline stopped first, so each backend has flushed its counters: a backend
flushes when idle at most every 10 s, always when it exits):

- ``pg_stat_user_tables``: rows inserted, updated (HOT or not) and deleted per
  table; index entries written, bounded above by (inserts + non-HOT updates) x
  the table's indexes (a partial index skips rows outside its predicate);
- ``pg_stat_database``: commits (read-only ones included: the bench's own polls
  are counted and taken off);
- transactions that wrote (xids handed out, cluster-wide: another database
  writing at the same time counts too);
- WAL bytes (cluster-wide, as the xids);
- ``pg_stat_user_functions``: calls of the trigger functions, when
  ``track_functions`` is on for the database (``enable_function_stats``);
- ``pg_stat_statements``, when the server preloads it (``shared_preload_libraries``; the machine's PostgreSQL
  does not, a bench server started for the profile does): statements per job and the dearest statements
  (calls and planning + execution ms per job). The bench's own polls are among them (named as such).
"""

from __future__ import annotations

from dataclasses import dataclass, field

TABLES_SQL = """
SELECT s.relname, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid)
FROM pg_stat_user_tables s
"""
DATABASE_SQL = """
SELECT d.xact_commit, pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
FROM pg_stat_database d WHERE d.datname = current_database()
"""
FUNCTIONS_SQL = "SELECT funcname, calls, self_time FROM pg_stat_user_functions"


STATEMENTS_SQL = """
SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 160), calls, total_exec_time + total_plan_time
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def enable_function_stats(cursor, database: str) -> None:
    """Count trigger-function calls in backends that connect from now on (superuser); and statements, when the
    server preloads pg_stat_statements."""
    cursor.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'pl'")
    cursor.execute("SELECT current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'")
    if cursor.fetchone()[0]:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


@dataclass
class Reading:
    tables: dict[str, tuple[int, int, int, int, int]] = field(default_factory=dict)
    commits: int = 0
    xid: int = 0
    wal: int = 0
    functions: dict[str, int] = field(default_factory=dict)
    function_ms: dict[str, float] = field(default_factory=dict)  # self time (ms): the function's own body
    statements: dict[int, tuple[str, int, float]] = field(default_factory=dict)  # queryid -> (text, calls, ms)


def wait_backends_gone(cursor, timeout: float = 10.0) -> bool:
    """Wait until this session is the database's only client (the others' exits flush their counters)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        if cursor.fetchone()[0] == 0:
            return True
        time.sleep(0.05)
    return False


def read(cursor) -> Reading:
    # Counters of this backend's own earlier statements reach the views only once flushed.
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    out = Reading()
    cursor.execute(TABLES_SQL)
    out.tables = {row[0]: tuple(int(v) for v in row[1:]) for row in cursor.fetchall()}
    cursor.execute(DATABASE_SQL)
    out.commits, out.xid, out.wal = (int(v) for v in cursor.fetchone())
    cursor.execute(FUNCTIONS_SQL)
    rows = cursor.fetchall()
    out.functions = {name: int(calls) for name, calls, _ in rows}
    out.function_ms = {name: float(ms) for name, _, ms in rows}
    cursor.execute("SELECT to_regclass('pg_stat_statements') IS NOT NULL")
    if cursor.fetchone()[0]:
        cursor.execute(STATEMENTS_SQL)
        out.statements = {qid: (text, int(calls), float(ms)) for qid, text, calls, ms in cursor.fetchall()}
    return out


def statements_per_job(before: Reading, after: Reading, jobs: int, top: int = 14) -> dict:
    """Statements per job and the dearest ones by time, from pg_stat_statements (empty without it)."""
    if not after.statements:
        return {}
    rows = []
    for qid, (text, calls, ms) in after.statements.items():
        _, calls0, ms0 = before.statements.get(qid, (text, 0, 0.0))
        if calls > calls0:
            rows.append((ms - ms0, calls - calls0, text))
    rows.sort(reverse=True)
    return {
        "pg_statements_per_job": sum(r[1] for r in rows) / jobs,
        "pg_statement_ms_per_job": sum(r[0] for r in rows) / jobs,
        "pg_statements": [{"ms": ms / jobs, "calls": calls / jobs, "query": text} for ms, calls, text in rows[:top]],
    }


def per_job(before: Reading, after: Reading, jobs: int, *, own_commits: int = 0) -> dict:
    """The window's work divided by its jobs: flat metrics (``pg_*_per_job``) and a per-table breakdown."""
    if jobs <= 0:
        return {}
    rows = {"ins": 0, "upd": 0, "hot": 0, "del": 0}
    index_entries = 0
    tables = {}
    for name, now in after.tables.items():
        then = before.tables.get(name, (0, 0, 0, 0, now[4]))
        ins, upd, hot, dele = (now[i] - then[i] for i in range(4))
        if not (ins or upd or dele):
            continue
        entries = (ins + upd - hot) * now[4]
        tables[name] = {
            "inserted": ins / jobs,
            "updated": upd / jobs,
            "hot_updated": hot / jobs,
            "deleted": dele / jobs,
            "index_entries_max": entries / jobs,
        }
        rows["ins"] += ins
        rows["upd"] += upd
        rows["hot"] += hot
        rows["del"] += dele
        index_entries += entries
    functions = {
        name: (calls - before.functions.get(name, 0)) / jobs
        for name, calls in after.functions.items()
        if calls != before.functions.get(name, 0)
    }
    return {
        "pg_commits_per_job": (after.commits - before.commits - own_commits) / jobs,
        "pg_writing_xacts_per_job": (after.xid - before.xid) / jobs,
        "pg_rows_inserted_per_job": rows["ins"] / jobs,
        "pg_rows_updated_per_job": rows["upd"] / jobs,
        "pg_rows_hot_updated_per_job": rows["hot"] / jobs,
        "pg_rows_deleted_per_job": rows["del"] / jobs,
        "pg_index_entries_max_per_job": index_entries / jobs,
        "pg_wal_bytes_per_job": (after.wal - before.wal) / jobs,
        "pg_trigger_calls_per_job": sum(functions.values()),
        # Wall time inside the trigger functions' own bodies (track_functions; a backend's CPU, mostly).
        "pg_trigger_ms_per_job": sum(ms - before.function_ms.get(name, 0.0) for name, ms in after.function_ms.items())
        / jobs,
        "pg_tables": tables,
        "pg_functions": functions,
        **statements_per_job(before, after, jobs),
    }
