"""`dispatchbench --quick` runs every scenario and variant end to end (what CI runs of the benchmark).

A real subprocess against the configured PostgreSQL and Redis, in the bench's
own database (productflow_bench_ci) and Redis db index (8); nothing is timed.
"""

import importlib.util
import json
import os
import subprocess

import pytest

from bench import SCENARIOS, variants
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [pytest.mark.acceptance]


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
            "productflow_bench_ci",
            "--redis-db",
            "8",
        ],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
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
        if rec["scenario"] != "peers" or rec["variant"] == "productflow" or peer_installed:
            assert rec["metrics"], f"{rec['scenario']}/{rec['variant']}: {rec.get('error')}"
    # The benchmark-only requirements (requirements/bench.txt) may be absent where only test.txt is installed:
    # then the peers are recorded with their import error (checked above) and the plots are skipped.
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "drain-progress.png").exists()
        assert (tmp_path / "idle-latency-latency-cdf.png").exists()
    else:
        assert "plots skipped" in proc.stdout
    assert "== drain ==" in proc.stdout
