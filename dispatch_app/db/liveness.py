"""Is a process alive? Its PostgreSQL session answers at once.

A worker or a dispatcher holds one idle session (a ``Beacon``) whose
``application_name`` carries its name. A process killed (-9, OOM, host gone
with its TCP connection reset) loses that session at once: PostgreSQL ends the
backend when the socket closes, and ``pg_stat_activity`` no longer lists it.
So "no such session" says "dead" within seconds, where a heartbeat key only
says it at its expiry (6 heartbeat periods for an RQ worker). A slow process
(a long vendor call) keeps its session: the beacon runs on its own thread and
never waits on the work.

Only a session PostgreSQL could show is evidence: a worker names, in its RQ
hash, the server instance its beacon is on (``where``); a reader on another
server (or a PostgreSQL restarted since, before the beacon is back) cannot see
it and says ``None`` (ask the heartbeat instead). A beacon whose session was
terminated reconnects at once, so a live process is without one only for the
length of a reconnect. A host that vanishes without closing its sockets leaves
its session for the TCP keepalives to end (~15 s, ``SERVER_KEEPALIVE``); until
then its heartbeat's expiry is what tells. A claim is read from a hash anyone on Redis's network can write:
only one shaped like a tag (``tag_like``) is looked up, so one forged claim cannot blind the judgment of all.
"""

from __future__ import annotations

import hashlib
import logging
import select
import threading
from collections.abc import Callable, Iterable

import psycopg

log = logging.getLogger("dispatch_app.db.liveness")

WORKER = "pf-worker:"
DISPATCHER = "pf-dispatcher:"
# The RQ worker hash's field where a worker names its session: "<application_name> <server>" (Beacon.claim).
WORKER_HASH_FIELD = "pf_pg_session"
# PostgreSQL keeps NAMEDATALEN - 1 bytes of an application_name; a longer name is hashed to fit.
NAME_BYTES = 63

# A host that vanishes without closing its sockets (power, network) is not a kill: the server would hold its session
# for hours (the kernel's keepalive default). These end it within ~15 s on the server's side; the client's side
# gives up on a silent server as soon, and reconnects. Both are ignored on unix sockets (nothing to lose there).
SERVER_KEEPALIVE = "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
CLIENT_KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}

# The server instance a session lives on: a reader compares it with its own before it believes an absence.
WHERE_SQL = "SELECT current_database() || '@' || extract(epoch FROM pg_postmaster_start_time())::text"
SESSIONS_SQL = "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name = ANY(%s)"


def tag(kind: str, name: str) -> str:
    """The application_name of ``name``'s beacon (``kind`` is WORKER or DISPATCHER)."""
    full = f"{kind}{name}"
    if len(full.encode()) <= NAME_BYTES:
        return full
    return f"{kind}#{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def tag_like(session: str) -> bool:
    """Could ``session`` be a Beacon's application_name (``tag``)? A NUL byte sent as a query parameter fails the
    whole query (every worker's verdict with it); a claim anyone wrote into a hash is checked first."""
    fits = len(session.encode(errors="replace")) <= NAME_BYTES
    return session.startswith((WORKER, DISPATCHER)) and fits and session.isprintable()


def where(cursor) -> str:
    cursor.execute(WHERE_SQL)
    return cursor.fetchone()[0]


def live_tags(cursor, tags: Iterable[str]) -> set[str]:
    """Which of ``tags`` have a session now (one query, whatever the count)."""
    wanted = sorted(set(tags))
    if not wanted:
        return set()
    cursor.execute(SESSIONS_SQL, [wanted])
    return {row[0] for row in cursor.fetchall()}


def verdicts(cursor, claims: dict[str, str | None]) -> dict[str, bool | None]:
    """name -> alive (True/False), or None when its session cannot be seen from here.

    ``claims``: name -> what its process wrote (``Beacon.claim``: "<tag> <where>"), None if nothing.
    """
    here = None
    parsed: dict[str, str] = {}
    for name, claim in claims.items():
        if not claim or " " not in claim:
            continue
        session, at = claim.split(" ", 1)
        if not tag_like(session):
            continue  # not what a Beacon writes (anyone may write the hash): no evidence, and never sent to SQL
        if here is None:
            here = where(cursor)
        if at == here:
            parsed[name] = session
    alive = live_tags(cursor, parsed.values())
    return {name: (parsed[name] in alive if name in parsed else None) for name in claims}


def judged(claims: dict[str, str | None]) -> dict[str, bool | None]:
    """``verdicts`` on Django's connection; {} (nobody judged) when there is no claim or PostgreSQL cannot answer."""
    from django.db import DatabaseError, connection

    if not any(claims.values()):
        return {}
    try:
        with connection.cursor() as cursor:
            return verdicts(cursor, claims)
    except DatabaseError:
        return {}


class Beacon(threading.Thread):
    """Holds one idle autocommit session named ``session_tag`` while the process lives; reconnects when it is lost.

    ``claim`` ("<tag> <where>") is what the process publishes so readers can tell; it is set while connected.
    ``on_connect(claim)`` runs after each (re)connect (e.g. to publish it at once).
    """

    def __init__(
        self,
        session_tag: str,
        conninfo: Callable[[], dict],
        *,
        on_connect: Callable[[str], None] | None = None,
        check_every: float = 1.0,
        retry_every: float = 0.5,
    ):
        super().__init__(name=f"beacon-{session_tag}", daemon=True)
        self.tag = session_tag
        self.conninfo = conninfo
        self.on_connect = on_connect
        self.check_every = check_every
        self.retry_every = retry_every
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.claim: str | None = None
        self._failing = False

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._hold()
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, the process lives on
                self.connected.clear()
                if not self._failing:
                    log.warning(
                        "liveness session %s lost (%s: %s); reconnecting every %ss",
                        self.tag,
                        type(exc).__name__,
                        " ".join(str(exc).split()),
                        self.retry_every,
                        extra={"action": "beacon_lost", "domain": "liveness"},
                    )
                self._failing = True
                # Short and fixed, not a growing backoff: a live process without its session reads dead.
                self.stopping.wait(self.retry_every)
        self.connected.clear()

    def _hold(self) -> None:
        params = {**CLIENT_KEEPALIVE, **self.conninfo(), "application_name": self.tag}
        params["options"] = f"{params.get('options') or ''} {SERVER_KEEPALIVE}".strip()
        params.setdefault("connect_timeout", 10)
        with psycopg.connect(autocommit=True, **params) as conn:
            with conn.cursor() as cursor:
                self.claim = f"{self.tag} {where(cursor)}"
            self.connected.set()
            if self._failing:
                log.info(
                    "liveness session %s restored",
                    self.tag,
                    extra={"action": "beacon_restored", "domain": "liveness"},
                )
            self._failing = False
            if self.on_connect is not None:
                try:
                    self.on_connect(self.claim)
                except Exception:  # noqa: BLE001 - publishing is retried by the process's own beat
                    log.warning(
                        "liveness session %s: could not publish it yet",
                        self.tag,
                        exc_info=True,
                        extra={"action": "beacon_publish_failed", "domain": "liveness"},
                    )
            while not self.stopping.is_set():
                # A terminated backend makes the socket readable (its FATAL, then EOF): check at once.
                select.select([conn.fileno()], [], [], self.check_every)
                if self.stopping.is_set():
                    return
                conn.execute("SELECT 1")  # raises on a dead session (and reads what made the socket readable)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=timeout)


def django_conninfo() -> dict:
    """Connection parameters from Django's default database (the socket directory included), for a Beacon."""
    from django.db import connections

    params = dict(connections["default"].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params
