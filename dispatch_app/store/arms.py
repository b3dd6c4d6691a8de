"""A dispatcher's arm (``NotifyArm``): while one is armed, writers announce new work (``dispatch.arming``).

Each statement returns the seconds its lease has left on the database clock, or nothing.
"""

from __future__ import annotations

ARM = "dispatch_app_notifyarm"

# Rows of dispatchers gone for an hour are removed by whoever arms next, so the
# writers' read stays one small page.
ARM_SQL = f"""
WITH gone AS (
    DELETE FROM {ARM} WHERE armed_until < clock_timestamp() - interval '1 hour' AND token <> %(token)s
)
INSERT INTO {ARM} (token, process, armed_at, armed_until)
VALUES (%(token)s, %(process)s, clock_timestamp(), clock_timestamp() + make_interval(secs => %(lease)s))
ON CONFLICT (token) DO UPDATE SET armed_at = EXCLUDED.armed_at, armed_until = EXCLUDED.armed_until
RETURNING extract(epoch FROM armed_until - clock_timestamp())::float8
"""

# Only extends a lease that has not run out: after a lapse the writers may have
# skipped announcements, and only a fresh arm (fence, hand-over) covers that.
RENEW_SQL = f"""
UPDATE {ARM} SET armed_until = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE token = %(token)s AND armed_until > clock_timestamp()
RETURNING extract(epoch FROM armed_until - clock_timestamp())::float8
"""

DISARM_SQL = f"UPDATE {ARM} SET armed_until = clock_timestamp() WHERE token = %(token)s"
