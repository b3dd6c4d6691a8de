"""``manage.py dispatchbench``: each removed wait shown side by side with the design it replaces.

One module per scenario; each exposes ``VARIANTS`` (the compared designs, in
order) and ``run(ctx) -> list[record]``. A record is one scenario + variant:
its parameters, the per-repeat metrics, their medians, and series for the plots.
``bench.stats`` holds the arithmetic, ``bench.report`` the table, JSON and PNGs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from bench.stats import median_metrics

SCENARIOS: dict[str, str] = {
    "idle-latency": "bench.idle_latency",
    "isolation": "bench.isolation",
    "drain": "bench.drain",
    "locked-head": "bench.locked_head",
    "recovery-storm": "bench.recovery_storm",
    "recovery-dispatcher": "bench.recovery_dispatcher",
    "send-admission": "bench.send_admission",
    "index": "bench.index",
    "peers": "bench.peers",
    "write-concurrency": "bench.write_concurrency",
    "submit-cost": "bench.submit_cost",
    "worker-ceiling": "bench.worker_ceiling",
    "pipeline-cpu": "bench.pipeline_cpu",
    "tasks-enqueue": "bench.tasks_enqueue",
}


def scenario_module(name: str):
    return importlib.import_module(SCENARIOS[name])


def variants(name: str) -> list[str]:
    return list(scenario_module(name).VARIANTS)


@dataclass
class Context:
    env: object
    quick: bool
    repeat: int
    log: object = print
    sizes: dict = field(default_factory=dict)

    def size(self, key: str, full, quick):
        """A scenario size: an explicit --size override, else the full or quick default."""
        if key in self.sizes:
            return type(full)(self.sizes[key])
        return quick if self.quick else full


def record(scenario: str, variant: str, params: dict, runs: list[dict], series: dict | None = None, **extra) -> dict:
    return {
        "scenario": scenario,
        "variant": variant,
        "params": params,
        "metrics": median_metrics(runs) if runs else {},
        "repeats": runs,
        "series": series or {},
        **extra,
    }


def side_by_side(ctx: Context, scenario: str, variant_names: list[str], run_one) -> dict[str, dict]:
    """Run every variant once per repeat, interleaved, so load drifts hit all of them alike.

    ``run_one(variant, repeat) -> (metrics, series)``; an exception is recorded
    as that run's error instead of ending the scenario.
    """
    runs: dict[str, list[dict]] = {v: [] for v in variant_names}
    series: dict[str, dict] = {v: {} for v in variant_names}
    errors: dict[str, str] = {}
    for index in range(ctx.repeat):
        for variant in variant_names:
            ctx.log(f"  {scenario} / {variant} (run {index + 1}/{ctx.repeat})")
            try:
                metrics, s = run_one(variant, index)
            except Exception as exc:  # noqa: BLE001 - one failed run must not hide the others
                errors[variant] = f"{type(exc).__name__}: {exc}"
                ctx.log(f"    failed: {errors[variant]}")
                continue
            runs[variant].append(metrics)
            series[variant] = s or series[variant]
    return {"runs": runs, "series": series, "errors": errors}
