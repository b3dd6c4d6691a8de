"""Helpers shared by the test tiers (no fixtures here)."""

from __future__ import annotations

import copy
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MANAGE = str(ROOT / "manage.py")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message="condition"):
    """A bounded poll for cross-process effects: a safety net, never thread synchronisation.

    ``message`` names what was awaited; a callable is called only on time-out (to show a child's log then).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout}s waiting for {shown}")
        time.sleep(interval)


def database_url_for_subprocess() -> str:
    """A URL for the database the tests run against (the test database), for child processes."""
    from django.db import connection

    params = connection.settings_dict
    name = params["NAME"]
    user = quote(params.get("USER") or "postgres")
    password = quote(params.get("PASSWORD") or "")
    host = params.get("HOST") or ""
    port = params.get("PORT") or ""
    socket_dir = (params.get("OPTIONS") or {}).get("host")
    auth = f"{user}:{password}@" if password else f"{user}@"
    if socket_dir and not host:
        return f"postgresql://{auth}/{name}?host={quote(str(socket_dir))}"
    return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{name}"


@contextmanager
def extra_alias(name: str, options=None, **changes):
    """A database alias of the test's own: the default's settings with ``changes`` (and ``options`` as its
    OPTIONS when given), its connection closed and the alias gone afterwards. Allowed outside django_db tests only
    (unblock the database first): a django_db test allows only the declared aliases."""
    from django.db import DEFAULT_DB_ALIAS, connections

    settings = {**copy.deepcopy(connections.settings[DEFAULT_DB_ALIAS]), **changes}
    if options is not None:
        settings["OPTIONS"] = options
    connections.settings[name] = settings
    try:
        yield connections[name]
    finally:
        connections[name].close()
        del connections[name]
        del connections.settings[name]


def sign_rq_job(conn, rq_job) -> None:
    """Give a job written by a test the dispatcher's signature (dispatch_app.rq.ids), as if the dispatcher wrote it:
    for tests of what comes after admission (the start's gate, the run), not of admission itself."""
    from dispatch_app.rq.ids import SIGNATURE_FIELD, signature

    conn.hset(rq_job.key, SIGNATURE_FIELD, signature(rq_job.id, rq_job.func_name, rq_job.origin))
