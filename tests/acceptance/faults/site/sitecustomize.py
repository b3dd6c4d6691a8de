"""Test-only process instrumentation for the fault suite (on PYTHONPATH only in its child processes).

PF_FAULTS_LEDGER=<file>   every execution of a domain's work appends "domain job attempt pid time" to the file
                          (O_APPEND, one short write per line, so concurrent workers never interleave).
                          This is the count of side effects the suite checks; it wraps the domain's
                          ``work`` callable, the seam a real task would run, and changes nothing else.
                          ``time`` (time.time() as the work begins) is what bench/peers.py reads: the
                          benchmark puts this directory on its workers' PYTHONPATH too (bench/workers.py).
PF_FAULTS_CLOCK_OFFSET=<s> the host clock of this process is off by <s> seconds: time.time(),
                          time.time_ns() and datetime.now()/utcnow()/today() are shifted (scenario 10).
"""

import os
import sys

_offset = float(os.environ.get("PF_FAULTS_CLOCK_OFFSET") or 0)
if _offset:
    import datetime as _dt
    import time as _time

    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _offset
    _time.time_ns = lambda: _real_time_ns() + int(_offset * 1e9)

    _Real = _dt.datetime
    _delta = _dt.timedelta(seconds=_offset)

    class _Meta(type):
        # Values built elsewhere (psycopg, C code) are real datetimes: they must still pass isinstance.
        def __instancecheck__(cls, obj):
            return isinstance(obj, _Real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, _Real)

    class _SkewedDatetime(_Real, metaclass=_Meta):
        @classmethod
        def now(cls, tz=None):
            return _Real.now(tz) + _delta

        @classmethod
        def utcnow(cls):
            return _Real.now(_dt.UTC).replace(tzinfo=None) + _delta

        @classmethod
        def today(cls):
            return _Real.now() + _delta

    _dt.datetime = _SkewedDatetime
    sys.stderr.write(
        f"PF_FAULTS clock offset {_offset:+.0f}s active: time.time()={_time.time():.0f} "
        f"datetime.now()={_dt.datetime.now().isoformat()}\n"
    )

_ledger = os.environ.get("PF_FAULTS_LEDGER")
if _ledger:
    import dataclasses
    import time

    from dispatch_app.domains import registry as _registry

    def _recording(domain_key, work):
        def recorded(ctx):
            line = f"{domain_key} {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n".encode()
            fd = os.open(_ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return work(ctx)

        recorded.recording = True
        return recorded

    _load = _registry._load

    def _load_recording():
        # Wrapped as the registry loads (settings are not configured yet when this file runs).
        loaded = _load()
        for _key, _domain in list(loaded.items()):
            if callable(_domain.work) and not getattr(_domain.work, "recording", False):
                loaded[_key] = dataclasses.replace(_domain, work=_recording(_key, _domain.work))
        return loaded

    _registry._load = _load_recording
