"""`dispatchbench --quick` runs every scenario and variant end to end (what CI runs of the benchmark).

A real subprocess against the configured PostgreSQL and Redis, in the bench's
own database (``<TEST_DATABASE_NAME>_bench``, default productflow_bench_ci) and
Redis db index (PRODUCTFLOW_TEST_REDIS_DB, default 8), so parallel checkouts do
not share them; nothing is timed.
"""

import importlib.util
import json
import os
import subprocess

import pytest

from bench import SCENARIOS, variants
from bench.peers import HOPS
from bench.workers import pipeline_available
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [pytest.mark.acceptance]

PEERS = {"procrastinate", "pgqueuer"}
# Variants run on the project's worker (dispatch_app.rq.worker, manage.py runworkers).
OURS_WORKER = {("peers", "productflow"), ("worker-ceiling", "productflow"), ("pipeline-cpu", "productflow")}


# The quick run starts ~100 processes (a dispatcher, its recovery child, workers and a producer per variant): 4 to
# 8 minutes on a 2-core machine, so it has a budget of its own, and the subprocess's timeout (the clearer error)
# comes before the test's.
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    bool(os.environ.get("PRODUCTFLOW_SKIP_BENCH_QUICK")),
    reason="PRODUCTFLOW_SKIP_BENCH_QUICK is set (.ci/run runs this test once, on its first path)",
)
def test_quick_run_records_every_scenario_and_variant(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DJANGO_SETTINGS_MODULE"] = "productflow.settings"
    proc = subprocess.run(
        [
            PYTHON,
            MANAGE,
            "dispatchbench",
            "--quick",
            "--repeat",
            "1",
            "--out",
            str(tmp_path),
            "--bench-db",
            f"{os.environ['TEST_DATABASE_NAME']}_bench"
            if os.environ.get("TEST_DATABASE_NAME")
            else "productflow_bench_ci",
            "--redis-db",
            os.environ.get("PRODUCTFLOW_TEST_REDIS_DB", "8"),
            "--keep-logs",
        ],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    results = tmp_path / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads(results.read_text())
    seen = {(r["scenario"], r["variant"]) for r in records}
    expected = {(s, v) for s in SCENARIOS for v in variants(s)}
    assert expected <= seen
    for rec in records:
        assert rec["machine"]["cores"] >= 1
        assert rec["versions"]["rq"]
        # A peer is recorded with its import error where requirements/bench.txt is not installed;
        # where it is (CI installs it), every variant, the peers included, must measure.
        peer_installed = importlib.util.find_spec(rec["variant"]) is not None
        if rec["variant"] in PEERS and not peer_installed:
            continue
        if (rec["scenario"], rec["variant"]) in OURS_WORKER and not pipeline_available():
            # The project's worker before it lands: recorded as not available, never silently missing.
            assert rec["error"].startswith("Unavailable"), rec.get("error")
            continue
        assert rec["metrics"], f"{rec['scenario']}/{rec['variant']}: {rec.get('error')}"
    # The benchmark-only requirements (requirements/bench.txt) may be absent where only test.txt is installed:
    # then the peers are recorded with their import error (checked above) and the plots are skipped.
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "drain-progress.png").exists()
        assert (tmp_path / "idle-latency-latency-cdf.png").exists()
    else:
        assert "plots skipped" in proc.stdout
    assert "== drain ==" in proc.stdout
    # Our commit -> start, hop by hop, from what each step records (bench.peers._ours_hops): every hop measured.
    ours = next(r for r in records if (r["scenario"], r["variant"]) == ("peers", "productflow"))
    if ours["metrics"]:
        missing = [name for name, _, _ in HOPS if ours["metrics"].get(f"w1_{name}_p50_ms_at200") is None]
        assert not missing, f"hops not measured: {missing}"
        # The claim is dated only for envelopes that were claimed; one sent ahead of its claim has none to date.
        claimed = ours["metrics"].get("w1_commit_to_claimed_p50_ms_at200")
        assert claimed is None or claimed >= 0, f"commit -> claimed read {claimed} ms"
        assert 0 <= ours["metrics"]["w1_claimed_share_at200"] <= 1
    _assert_logs_kept(tmp_path / "logs")


def _assert_logs_kept(logs):
    """--keep-logs: the runner's lines with the clock, and a file of its own per child, written as it ran."""
    runner = (logs / "runner.log").read_text()
    for scenario in SCENARIOS:
        assert f"{scenario}:" in runner, f"runner.log has no line for {scenario}"
    files = {path.name: path.stat().st_size for path in logs.glob("*.log") if path.name != "runner.log"}
    # Every worker says when it starts and stops; a producer may say nothing (its file is there, empty).
    for role in ("-dispatcher-dispatch-", "-pipeline-workers.log", "-simple-workers.log", "-producer-"):
        named = [name for name in files if role in name]
        assert named, f"no {role!r} log among {sorted(files)[:20]}"
    assert any(files[name] for name in files if "-workers.log" in name), "every worker log is empty"
