"""The pacer's arithmetic (recovery.pacing.Pacer): halve on slowed new work, grow back, floor, one shared look."""

from __future__ import annotations

import math

from django.db import OperationalError

from dispatch_app.config.tuning import BASELINE_DRIFT
from dispatch_app.recovery.pacing import GROWTH_PER_SECOND, MIN_SAMPLES, Pacer, Sample

DRIFT = 1 + BASELINE_DRIFT  # the quietest wait's rise per look


class Looks:
    """Samples served in order; counts the looks so a test sees them shared."""

    def __init__(self, *waits_ms):
        self.waits = list(waits_ms)
        self.calls = 0

    def __call__(self, window: float) -> Sample:
        self.calls += 1
        wait = self.waits.pop(0)
        if isinstance(wait, Exception):
            raise wait
        return Sample(MIN_SAMPLES if wait is not None else 0, wait)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pacer(looks, clock=None, **kw) -> Pacer:
    """A pacer whose domains start at their whole cap (the arithmetic from there); slow start has its own test."""
    options = dict(window=5.0, tolerance=1.25, slack_ms=2.0, min_share=0.1, start_share=1.0)
    options.update(kw)
    return Pacer(measure=looks, clock=clock or Clock(), sample_seconds=1.0, **options)


def rounds(p: Pacer, clock: Clock, domain: str, cap: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(p.allowance(domain, cap).limit)
        clock.now += 1.0
    return out


def test_slowed_new_work_halves_each_round_down_to_the_floor_then_grows_back_by_time():
    clock = Clock()
    # Quiet (the baseline), then slowed for five looks, then quiet again.
    looks = Looks(4.0, 40.0, 40.0, 40.0, 40.0, 40.0, 4.0, 4.0, 4.0, 4.0, 4.0)
    p = pacer(looks, clock)
    assert rounds(p, clock, "delivery", 25, 11) == [25, 12, 6, 3, 3, 3, 3, 5, 6, 7, 8]
    assert p.baseline_ms == 4.0  # drifted up through the slowed looks, back to the quietest at the first quiet one


def test_the_bound_is_tolerance_times_the_quietest_plus_slack():
    clock = Clock()
    # The quietest drifts up BASELINE_DRIFT per look before it is compared.
    at_bound = 10.0 * DRIFT * 1.25 + 2.0
    above_bound = 10.0 * DRIFT**2 * 1.25 + 2.0 + 0.01
    p = pacer(Looks(10.0, at_bound, above_bound), clock)
    judged = []
    for _ in range(3):
        judged.append(p.allowance("d", 20))
        clock.now += 1
    assert [a.congested for a in judged] == [False, False, True]
    assert judged[-1].limit == 10 and "new work slowed" in judged[-1].describe()


def test_too_few_first_attempts_is_headroom_and_leaves_the_baseline_alone():
    clock = Clock()
    p = pacer(Looks(5.0, None, 100.0), clock)
    rounds(p, clock, "d", 20, 1)
    assert p._measure.waits == [None, 100.0]
    allowed = p.allowance("d", 20)
    clock.now += 1
    assert not allowed.congested and allowed.limit == 20 and p.baseline_ms == 5.0
    assert p.allowance("d", 20).limit == 10


def test_one_look_serves_every_domain_within_a_second():
    clock = Clock()
    looks = Looks(5.0, 50.0)
    p = pacer(looks, clock)
    for domain in ("a", "b", "c", "d", "e"):
        p.allowance(domain, 25)
    assert looks.calls == 1
    clock.now += 1.0
    limits = [p.allowance(domain, 25).limit for domain in ("a", "b", "c")]
    assert looks.calls == 2 and limits == [12, 12, 12]


def test_a_failed_look_keeps_the_last_judgement():
    clock = Clock()
    p = pacer(Looks(5.0, 50.0, OperationalError("server closed the connection")), clock)
    assert rounds(p, clock, "d", 16, 3) == [16, 8, 4]


def test_floor_is_at_least_one_job_and_never_above_a_zero_cap():
    clock = Clock()
    p = pacer(Looks(5.0, *[500.0] * 10), clock, min_share=0.0)
    assert rounds(p, clock, "d", 8, 10)[-1] == 1
    assert p.allowance("d", 0).limit == 0  # MAX_REDISPATCHES_PER_ROUND = 0: report only, paced or not


def test_settings_switch_it_off():
    from dispatch_app.config.settings import validate

    assert Pacer.from_settings(validate({"RECOVERY_PACING": False})) is None
    on = Pacer.from_settings(validate({"RECOVERY_PACE_TOLERANCE": 2, "RECOVERY_PACE_MIN_SHARE": 0.5}))
    assert (on.tolerance, on.min_share, on.window, on.slack_ms, on.quantile) == (2.0, 0.5, 5.0, 0.25, 0.99)
    assert Pacer.from_settings(validate({})).tolerance == 1.1
    assert on.floor_seconds == 30.0
    assert Pacer.from_settings(validate({"RECOVERY_PACE_FLOOR_SECONDS": 0})).floor_seconds == 0.0


def test_the_quantile_setting_reaches_the_look_and_the_rounds_words():
    from dispatch_app.config.settings import validate

    p90 = Pacer.from_settings(validate({"RECOVERY_PACE_QUANTILE": 0.9}))
    assert p90.quantile == 0.9 and p90._measure.keywords == {"quantile": 0.9}
    p = pacer(Looks(4.0, 40.0), quantile=0.9)
    p.allowance("d", 10)
    p.clock.now += 1.0
    assert "new work's p90 start wait 40.0 ms" in p.allowance("d", 10).describe()


def test_a_domain_starts_at_the_floor_so_the_quietest_wait_is_seen_before_the_share_grows():
    clock = Clock()
    # Quiet while the share grows; slowed once it is large; quiet again after the halving.
    looks = Looks(4.0, 4.0, 4.0, 4.0, 4.0, 30.0, 4.0)
    p = pacer(looks, clock, start_share=None)
    assert p.start_share == p.min_share == 0.1
    assert rounds(p, clock, "fast", 20, 1) == [2]  # the floor: 10 % of 20
    clock.now += 9.0  # the share grows by the seconds since the domain's last round
    assert rounds(p, clock, "fast", 20, 1) == [round(20 * (0.1 + GROWTH_PER_SECOND * 10))]
    assert rounds(p, clock, "fast", 20, 3) == [13, 14, 15]
    assert p.baseline_ms == 4.0
    assert p.allowance("fast", 20).limit == 7  # slowed: halved from 0.75 (15 jobs) to 0.375
    from dispatch_app.config.settings import validate

    configured = Pacer.from_settings(validate({}))
    assert configured.start_share == configured.min_share  # the setting's pacer starts slow too


def test_the_share_grows_back_by_the_seconds_since_the_last_round_not_by_rounds():
    clock = Clock()
    p = pacer(Looks(5.0, 50.0, 50.0, 5.0, 5.0), clock)
    assert rounds(p, clock, "fast", 20, 3) == [20, 10, 5]  # a round per second, slowed twice: a quarter
    clock.now += 9.0  # ten seconds after its last round (a loop with a 10 s period, or a round skipped)
    assert p.allowance("fast", 20).limit == round(20 * (0.25 + GROWTH_PER_SECOND * 10)) == 15
    clock.now += 30.0
    assert p.allowance("fast", 20).limit == 20


def slowed_rounds(floor_seconds: float, period: float, n: int) -> list[int]:
    """A round every ``period`` s of a domain with a cap of 25 while new work stays slowed from the second look."""
    clock = Clock()
    p = pacer(Looks(4.0, *[400.0] * n), clock, min_share=0.1, start_share=None, floor_seconds=floor_seconds)
    out = []
    for _ in range(n):
        out.append(p.allowance("delivery", 25, period).limit)
        clock.now += period
    return out


def test_a_round_per_second_owes_the_floor_per_floor_seconds_not_per_round():
    per_second = slowed_rounds(30.0, 1.0, 60)
    # 10 % of 25 per 30 s: 2.5 jobs, one at a time as the fractions add up, in rounds that send nothing between.
    assert sum(per_second) == 5 and set(per_second) == {0, 1}
    assert [i for i, n in enumerate(per_second) if n] == [11, 23, 35, 47, 59]
    # Owed per round (RECOVERY_PACE_FLOOR_SECONDS = 0): 3 every second, thirty-six times as much.
    assert slowed_rounds(0.0, 1.0, 60) == [3] * 60
    # A round every 30 s or more is unchanged: the floor per round, rounded up.
    assert slowed_rounds(30.0, 30.0, 4) == slowed_rounds(0.0, 30.0, 4) == [3, 3, 3, 3]
    assert slowed_rounds(30.0, 300.0, 2) == [3, 3]


def per_second_rounds(*waits, n: int) -> tuple[list[int], Pacer]:
    """A round per second of a domain with a cap of 25 (floor per 30 s), the looks ``waits`` in order."""
    clock = Clock()
    p = pacer(Looks(*waits), clock, min_share=0.1, start_share=None, floor_seconds=30.0)
    limits = []
    for _ in range(n):
        limits.append(p.allowance("d", 25, 1.0).limit)
        clock.now += 1.0
    return limits, p


def test_the_fraction_carried_is_spent_once_the_share_grows_back_to_a_job_per_round():
    # Slowed at the second look, then quiet: the share regrows by 5 % of the cap per 30 s each second (a job per
    # round after ~22 s); below a job per round the fractions add up to a job now and then, never two in a round.
    limits, p = per_second_rounds(4.0, 400.0, *[4.0] * 40, n=42)
    assert set(limits[:21]) == {0, 1} and 0 < sum(limits[:21]) < 10
    assert limits[24:] == [1] * 18
    assert p._shares["d"][2] == 0.0


def test_a_round_per_second_regrows_the_recovered_rate_as_a_round_per_30_s_does_unless_nothing_is_there_to_slow():
    # The recovered rate a quiet second adds is the same for a round per second and a round per 30 s.
    p = per_second_rounds(4.0, n=1)[1]
    assert math.isclose(p.regrowth(1.0) * 25 / 1.0, p.regrowth(30.0) * 25 / 30.0)
    assert p.regrowth(30.0) == p.regrowth(None) == p.regrowth(1.0, idle=True) == GROWTH_PER_SECOND
    quiet, _ = per_second_rounds(4.0, 400.0, *[4.0] * 10, n=12)
    # No new work to judge after the slowed look: the cap comes back at 5 % of it per second, as before.
    idle, _ = per_second_rounds(4.0, 400.0, *[None] * 10, n=12)
    assert idle == [0, 0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12] and sum(quiet) <= 3 < sum(idle) // 10


def test_new_work_appearing_beside_a_storm_drops_every_domain_to_its_floor_before_the_quietest_is_taken():
    # No new work to judge (recovery at its cap), then new work slowed by the storm, waits seen at the floor.
    waits = (None, 20.0, 20.0, 20.0, 4.0, 4.0, 6.0)
    clock = Clock()
    p = pacer(Looks(*waits), clock, probe_seconds=3.0)
    limits = []
    for _ in waits:
        limits.append(p.allowance("d", 20))
        clock.now += 1.0
    assert [a.limit for a in limits] == [20, 2, 2, 2, 3, 4, 5]
    assert [a.probing for a in limits] == [False, True, True, True, False, False, False]
    assert "at the floor while new work's quietest start wait is measured" in limits[1].describe()
    assert p.baseline_ms == 4.0 * DRIFT  # the quiet look's 4.0, drifted up once by the last look (6.0)
    # Without the probe the storm's own wait became the quietest, and the storm went on at its cap.
    clock = Clock()
    unprobed = pacer(Looks(*waits), clock)
    assert rounds(unprobed, clock, "d", 20, len(waits)) == [20] * len(waits) and unprobed.baseline_ms == 4.0 * DRIFT
    from dispatch_app.config.settings import validate

    assert Pacer.from_settings(validate({"RECOVERY_PACE_WINDOW": 10})).probe_seconds == 12.0


def test_a_load_heavier_for_good_stops_reading_as_congestion_within_minutes_not_seconds():
    clock = Clock()
    # Quiet at 4 ms, then new work's wait 1.5x that for good (a heavier load, not recovery's doing).
    p = pacer(Looks(4.0, *[6.0] * 400), clock, tolerance=1.1, slack_ms=0.25)
    judged = []
    for _ in range(401):
        judged.append(p.allowance("d", 20).congested)
        clock.now += 1.0
    first_quiet = judged.index(False, 1)
    # Read as congestion (recovery at its floor) for more than a minute, so a storm that raises new work's tail
    # is not taken for the new normal within one pacing window; and no longer once the quietest has caught up.
    assert 60 < first_quiet < 300 and not any(judged[first_quiet:])
