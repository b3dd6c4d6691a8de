"""Child process for scenario 7: a session of ours, built from the project's settings.

``timeouts``: print the three timeouts of a Django session and of the listener's
connection, then show that statement_timeout and lock_timeout cut a slow
statement and a lock wait (row ids to wait for on argv). ``stuck <ids>``: lock the
envelopes and then hang inside the transaction, as a stuck process would.
"""

import json
import sys
import time


def main() -> None:
    import django

    django.setup()
    import psycopg
    from django.db import connection, transaction

    from dispatch_app.dispatch.listener import listener_conninfo

    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    mode, ids = sys.argv[1], [int(x) for x in sys.argv[2:]]
    if mode == "stuck":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id FROM dispatch_app_dispatchenvelope WHERE id = ANY(%s) FOR UPDATE", [ids])
            print(json.dumps({"locked": len(cursor.fetchall())}), flush=True)
            time.sleep(120)  # the stuck process: it never comes back to its transaction
        return

    report = {}
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"SHOW {name}")
            report[f"django.{name}"] = cursor.fetchone()[0]
    with psycopg.connect(autocommit=True, **listener_conninfo()) as conn:
        for name in names:
            report[f"listener.{name}"] = conn.execute(f"SHOW {name}").fetchone()[0]
    for label, sql, params in (
        ("slow_statement", "SELECT pg_sleep(30)", None),
        ("lock_wait", "SELECT id FROM dispatch_app_dispatchenvelope WHERE id = ANY(%s) FOR UPDATE", [ids]),
    ):
        started = time.monotonic()
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, params)
            report[label] = "completed"
        except Exception as exc:  # the outcome under test
            report[label] = f"{type(exc.__cause__ or exc).__name__}: {str(exc).splitlines()[0]}"
        report[f"{label}_seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
