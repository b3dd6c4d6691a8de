"""REDIS_URL_<QUEUE> puts a domain's queue on its own Redis (with the same bounded timeouts); unset, REDIS_URL.

Each declared domain's queue gets its RQ_QUEUES entry when the app is ready (dispatch_app.rq.servers).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHOW = (
    "import json, os, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'productflow.settings'; django.setup(); "
    "from django.conf import settings as s; "
    "print(json.dumps({'base': s.REDIS_URL, 'queues': {k: v['URL'] for k, v in s.RQ_QUEUES.items()}}))"
)


def _settings(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_URL_")}
    clean.update(DATABASE_URL="postgres://u@127.0.0.1:5432/x", REDIS_URL="redis://127.0.0.1:6379/0", **env)
    clean.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_queue_stays_on_redis_url_by_default():
    shown = _settings()
    domains = {"workflow", "image_series", "delivery", "partial_edit", "agent"}
    # Each domain queue (the task backend's "default" among them) and its recovery lane (dispatch_app.domains.lanes).
    assert set(shown["queues"]) == {"default", "default.recovery"} | domains | {f"{q}.recovery" for q in domains}
    assert set(shown["queues"].values()) == {shown["base"]}


def test_a_queue_named_in_redis_url_queue_moves_to_its_own_server_with_timeouts():
    shown = _settings(REDIS_URL_DELIVERY="redis://redis-b:6379/2", REDIS_URL_IMAGE_SERIES="unix:///run/r.sock?db=1")
    delivery, images = shown["queues"]["delivery"], shown["queues"]["image_series"]
    assert delivery.startswith("redis://redis-b:6379/2?socket_timeout=") and "socket_connect_timeout=" in delivery
    assert images.startswith("unix:///run/r.sock?db=1&socket_timeout=")
    # A lane lives on its queue's server.
    assert shown["queues"]["delivery.recovery"] == delivery and shown["queues"]["image_series.recovery"] == images
    moved = ("delivery", "image_series", "delivery.recovery", "image_series.recovery")
    assert {q: u for q, u in shown["queues"].items() if q not in moved} == {
        q: shown["base"] for q in shown["queues"] if q not in moved
    }
