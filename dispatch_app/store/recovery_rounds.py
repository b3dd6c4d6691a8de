"""A recovery round's record (``RecoveryRound``): opened when the round starts, its counts written when it ends."""

from __future__ import annotations

from dispatch_app.models import RecoveryRound

FINISH_SQL = (
    "UPDATE dispatch_app_recoveryround SET finished_at = clock_timestamp(), scanned = %s, "
    "redispatched = %s, left_alone = %s, unknown = %s, failed = %s, skipped = %s, errors = %s, "
    "has_more = %s, oldest_candidate_age = %s, error = %s WHERE id = %s"
)
ERROR_MAX = 4000


def open_round(domain: str, process: str) -> int:
    return RecoveryRound.objects.create(domain=domain, process=process[:200]).pk


def finish_round(cursor, round_id: int, result) -> None:
    """The round's counts (``recovery.result.RoundResult``) and its error, at the database's clock."""
    cursor.execute(
        FINISH_SQL,
        [
            result.scanned,
            result.redispatched,
            result.left_alone,
            result.unknown,
            result.failed,
            result.skipped,
            result.errors,
            result.has_more,
            result.oldest_candidate_age,
            result.error[:ERROR_MAX],
            round_id,
        ],
    )
