"""Runs the chosen scenarios on the bench's own database and Redis db, then reports."""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path

from bench import SCENARIOS, Context, scenario_module
from bench.env import BenchEnv, load_average, machine, versions
from bench.logs import stamp
from bench.report import plots as write_plots
from bench.report import table, write_json, write_markdown


def run(
    *,
    scenarios: list[str],
    quick: bool,
    repeat: int,
    out: Path,
    sizes: dict,
    database_url: str | None,
    bench_db: str,
    redis_url: str | None,
    redis_db: int,
    keep_db: bool,
    plots: bool,
    stdout,
    keep_logs: bool = False,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs" if keep_logs else None
    if log_dir is not None:
        log_dir.mkdir(exist_ok=True)

    def log(text: str) -> None:
        stdout.write(text)
        stdout.flush()
        if log_dir is not None:
            with open(log_dir / "runner.log", "a", encoding="utf-8") as runner_log:
                runner_log.write(stamp(text))

    env = BenchEnv(
        database_url=database_url,
        db_name=bench_db,
        redis_url=redis_url,
        redis_db=redis_db,
        keep_db=keep_db,
        log=log,
        log_dir=log_dir,
    )
    started = time.monotonic()
    load_before = machine()

    def on_sigterm(signum, frame):
        # Unwind through the finally blocks: children stopped, our database dropped.
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    records: list[dict] = []
    env.setup()
    try:
        header = {
            "machine": load_before,
            "versions": dict(versions(), postgresql=env.server_version(), redis_server=env.redis_version()),
            "where": env.describe(),
            "quick": quick,
            "repeat": repeat,
        }
        log(
            f"dispatchbench: {header['where']['database']}, redis {header['where']['redis']}, "
            f"{load_before['cores']} cores, load {load_before['load_average']}, repeat {repeat}"
            f"{' (quick)' if quick else ''}"
        )
        for name in scenarios:
            scenario_started = time.monotonic()
            log(f"{name}:")
            ctx = Context(env=env, quick=quick, repeat=repeat, log=log, sizes=sizes)
            try:
                recs = scenario_module(name).run(ctx)
            except Exception as exc:  # noqa: BLE001 - one scenario's failure is recorded, the run goes on
                log(f"  {name} failed: {type(exc).__name__}: {exc}")
                recs = [
                    {
                        "scenario": name,
                        "variant": v,
                        "params": {},
                        "metrics": {},
                        "repeats": [],
                        "series": {},
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                    for v in scenario_module(name).VARIANTS
                ]
                try:
                    env.reset()
                except Exception:  # noqa: BLE001, S110 - the next scenario resets again
                    pass
            for rec in recs:
                rec["seconds"] = round(time.monotonic() - scenario_started, 2)
            records.extend(recs)
        header["load_after"] = load_average()
        header["total_seconds"] = round(time.monotonic() - started, 1)
    finally:
        env.teardown()
    json_path = write_json(records, out, header)
    write_markdown(records, out, header)
    log("")
    log(table(records))
    log("")
    log(f"results: {json_path}")
    if log_dir is not None:
        log(f"logs: {log_dir}")
    if plots and importlib.util.find_spec("matplotlib") is None:
        log("plots skipped: matplotlib is not installed (pip install -r requirements/bench.txt)")
    elif plots:
        for path in write_plots(records, out):
            log(f"plot: {path}")
    log(f"total {header['total_seconds']} s; load before {load_before['load_average']}, after {header['load_after']}")
    # A peer that cannot install or run here is a recorded result, not a failed run.
    failed = [
        r
        for r in records
        if r.get("error")
        and not r["metrics"]
        and (r["scenario"] != "peers" or r["variant"].startswith("productflow"))
        # A variant this checkout cannot run yet (e.g. the project's worker before it lands).
        and not r["error"].startswith("Unavailable")
    ]
    assert set(SCENARIOS) >= {r["scenario"] for r in records}
    return 1 if failed else 0
