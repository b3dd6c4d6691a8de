"""The built package in a new Django project, by the README's "Use it in your Django project", to the letter.

From the repository tree only the package's own files are copied out: the sdist is built from them, the wheel
from the sdist, and a fresh virtualenv installs the wheel with pip resolving its declared dependencies (from
the pip cache when it has them). ``django-admin startproject`` then gets the README's settings block appended
(its placeholders swapped for this run's database and Redis), ``migrate``, ``rundispatcher`` and ``runworkers``
run as the README says, a view enqueues tasks in its transaction and another reads their results back, and the
admin's dashboard answers 200 listing the project's queues only -- no demo domain.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import dj_database_url
import psycopg
import pytest

from tests.helpers import ROOT, wait_until

pytestmark = [
    pytest.mark.package,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs the machine's PostgreSQL and Redis (DATABASE_URL, REDIS_URL); runs in CI's service legs",
    ),
    pytest.mark.version_dependent,
]

README = (ROOT / "README.md").read_text()
DEMO_DOMAINS = ("workflow", "image_series", "delivery", "partial_edit", "agent")
# What the README's settings block names, replaced by this run's servers (asserted present, so a README
# change that drops one fails here instead of silently testing something else).
PLACEHOLDERS = ('"NAME": "mysite"', '"HOST": "127.0.0.1"', '"PORT": 5432', '"USER": "postgres"', '"PASSWORD": ""')
README_REDIS = "redis://127.0.0.1:6379/0"

SHOP_TASKS = """
try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2: the backport
from dispatch_app.tasks import retry_safe


@task()
def send_receipt(order_id, email):
    return {"sent": f"receipt {order_id} to {email}"}


@task(queue_name="thumbnails", takes_context=True)
@retry_safe
def make_thumbnail(context, image, width=128):
    return {"thumbnail": f"{image}@{width}", "attempt": context.attempt}
"""
SHOP_VIEWS = """
from django.contrib.auth.models import Group
from django.db import transaction
from django.http import JsonResponse

from shop.tasks import make_thumbnail, send_receipt


def place_order(request):
    with transaction.atomic():
        order = Group.objects.create(name=request.GET["order"])  # any row of the view's own transaction
        receipt = send_receipt.enqueue(order.pk, "buyer@example.com")
        thumbnail = make_thumbnail.enqueue("shoe.png", width=64)
    return JsonResponse({"receipt": str(receipt.id), "thumbnail": str(thumbnail.id)})


def abandoned_order(request):
    try:
        with transaction.atomic():
            send_receipt.enqueue(0, "nobody@example.com")
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    return JsonResponse({})


def result(request, task_name, result_id):
    task = {"send_receipt": send_receipt, "make_thumbnail": make_thumbnail}[task_name]
    found = task.get_result(result_id)
    body = {"status": str(found.status.name)}
    if found.status.name == "SUCCESSFUL":
        body["return_value"] = found.return_value
    return JsonResponse(body)
"""
SHOP_URLS = """
from django.urls import path

from shop import views

urlpatterns = [
    path("order/", views.place_order),
    path("abandoned/", views.abandoned_order),
    path("result/<str:task_name>/<str:result_id>/", views.result),
]
"""
PROJECT_URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("shop/", include("shop.urls"))]
"""
ADMIN_CHECK = """
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

user = User.objects.create_superuser("admin", "admin@example.com", "not-secret")
client = Client(HTTP_HOST="localhost")
client.force_login(user)
page = client.get(reverse("admin:dispatch_app_dashboard"))
print("DASHBOARD", page.status_code)
print(page.content.decode())
"""


def settings_block() -> str:
    """The python block of "Use it in your Django project" that extends a project's settings."""
    section = README.split("## Use it in your Django project", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.DOTALL) if "INSTALLED_APPS +=" in b]
    assert len(blocks) == 1, "the README's section has exactly one settings block"
    return blocks[0]


def run(args, *, cwd, env, timeout=600) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def build(tmp: Path, env: dict) -> Path:
    """sdist from the package's files alone, then the wheel from the sdist: both carry everything needed."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dispatch_app", src / "dispatch_app", ignore=shutil.ignore_patterns("__pycache__"))
    builder = tmp / "build-venv"
    run([sys.executable, "-m", "venv", builder], cwd=tmp, env=env)
    run([builder / "bin/python", "-m", "pip", "install", "-q", "setuptools>=69"], cwd=tmp, env=env)
    dist = tmp / "dist"
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    sdist = dist / run([builder / "bin/python", "-c", code], cwd=src, env=env).strip().splitlines()[-1]
    run([builder / "bin/python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, sdist], cwd=tmp, env=env)
    (wheel,) = dist.glob("*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"dispatch_app"}, tops  # no productflow/, examples/, bench/, tests/
    assert "dispatch_app/templates/admin/dispatch_app/dashboard.html" in names
    assert "dispatch_app/migrations/0001_initial.py" in names
    # The commands that refuse the project's queues in django-rq's place ship with the app, hyphen and all.
    assert {f"dispatch_app/management/commands/{c}.py" for c in ("rqworker", "rqworker-pool")} <= set(names)
    assert not [n for n in names if "/management/commands/" in n and n.rsplit("/", 1)[1] in DEMO_COMMANDS]
    with tarfile.open(sdist) as archive:
        assert not [n for n in archive.getnames() if re.search(r"/(productflow|examples|bench|tests)/", n)]
    return wheel


DEMO_COMMANDS = {"demo.py", "loadgen.py", "dispatchbench.py", "embedded.py"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own runserver
        return json.loads(response.read())


@pytest.fixture
def database():
    """A database of its own on the machine's PostgreSQL, dropped afterwards."""
    server = dj_database_url.parse(os.environ["DATABASE_URL"])
    name = f"{os.environ.get('TEST_DATABASE_NAME') or 'test_productflow'}_pkg"
    admin_url = f"postgresql://{server['USER']}:{server['PASSWORD'] or ''}@{server['HOST']}:{server['PORT']}/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {**server, "NAME": name}
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url(redis_conn):
    """The tests' Redis database (flushed before and after by redis_conn)."""
    from django.conf import settings

    return settings.REDIS_URL.split("?", 1)[0]


def connect(database: dict) -> psycopg.Connection:
    return psycopg.connect(
        host=database["HOST"], port=database["PORT"] or 5432, user=database["USER"], dbname=database["NAME"]
    )


def recovery_loops(database: dict) -> dict:
    with connect(database) as conn:
        rows = conn.execute(
            "SELECT loop, last_tick_at, errors, last_error FROM dispatch_app_loopheartbeat WHERE loop LIKE 'recovery%'"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def test_the_wheel_in_a_new_project_runs_a_task_enqueued_in_a_views_transaction(tmp_path, database, redis_url):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env = {k: v for k, v in env.items() if not k.startswith(("DISPATCH_", "DATABASE_URL", "REDIS_URL"))}
    env["PYTHONUNBUFFERED"] = "1"
    wheel = build(tmp_path, env)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=env)
    python = venv / "bin/python"
    run([python, "-m", "pip", "install", "-q", wheel], cwd=tmp_path, env=env)  # resolves the declared dependencies
    where = run([python, "-c", "import dispatch_app; print(dispatch_app.__file__)"], cwd=tmp_path, env=env)
    assert where.startswith(str(venv)), where

    project = tmp_path / "mysite"
    project.mkdir()
    run([venv / "bin/django-admin", "startproject", "mysite", project], cwd=tmp_path, env=env)
    block = settings_block()
    values = {
        '"NAME": "mysite"': f'"NAME": {database["NAME"]!r}',
        '"HOST": "127.0.0.1"': f'"HOST": {database["HOST"]!r}',
        '"PORT": 5432': f'"PORT": {int(database["PORT"] or 5432)}',
        '"USER": "postgres"': f'"USER": {database["USER"]!r}',
        '"PASSWORD": ""': f'"PASSWORD": {database["PASSWORD"] or ""!r}',
        README_REDIS: redis_url,
    }
    for placeholder, value in values.items():
        assert placeholder in block, f"the README's settings block no longer has {placeholder}"
        block = block.replace(placeholder, value)
    run([python, "manage.py", "startapp", "shop"], cwd=project, env=env)
    settings_py = project / "mysite/settings.py"
    settings_py.write_text(settings_py.read_text() + "\n" + block + '\nINSTALLED_APPS += ["shop"]\n')
    (project / "shop/tasks.py").write_text(SHOP_TASKS)
    (project / "shop/views.py").write_text(SHOP_VIEWS)
    (project / "shop/urls.py").write_text(SHOP_URLS)
    (project / "mysite/urls.py").write_text(PROJECT_URLS)

    run([python, "manage.py", "migrate", "--noinput"], cwd=project, env=env)
    # The README's INSTALLED_APPS puts dispatch_app first: `rqworker` is the app's, which refuses a project queue.
    refused = subprocess.run(
        [python, "manage.py", "rqworker", "thumbnails", "--burst"], cwd=project, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 1 and "'manage.py runworkers'" in refused.stderr, refused.stdout + refused.stderr
    port = free_port()
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("web", "dispatcher", "workers")}  # noqa: SIM115
    commands = {
        "web": ["runserver", "--noreload", f"127.0.0.1:{port}"],
        "dispatcher": ["rundispatcher"],
        "workers": ["runworkers", "--processes", "1"],
    }
    procs = {
        name: subprocess.Popen(
            [python, "manage.py", *args], cwd=project, env=env, stdout=logs[name], stderr=subprocess.STDOUT
        )
        for name, args in commands.items()
    }
    try:
        base = f"http://127.0.0.1:{port}/shop"

        def log(name: str) -> str:
            return (tmp_path / f"{name}.log").read_text()[-3000:]

        def answers() -> bool:
            try:
                get_json(f"{base}/abandoned/")
            except urllib.error.HTTPError:
                raise  # the server answers, wrongly
            except OSError:  # not listening yet
                return False
            return True

        wait_until(answers, timeout=60, interval=0.2, message=lambda: f"the web server:\n{log('web')}")
        order = get_json(f"{base}/order/?order=o-1")
        expected = {
            "send_receipt": (order["receipt"], {"sent": "receipt 1 to buyer@example.com"}),
            "make_thumbnail": (order["thumbnail"], {"thumbnail": "shoe.png@64", "attempt": 1}),
        }

        def succeeded(task_name: str, result_id: str):
            found = get_json(f"{base}/result/{task_name}/{result_id}/")
            assert found["status"] in ("READY", "RUNNING", "SUCCESSFUL"), found
            for name, proc in procs.items():
                assert proc.poll() is None, f"{name} exited:\n{log(name)}"
            return found if found["status"] == "SUCCESSFUL" else None

        for task_name, (result_id, value) in expected.items():
            found = wait_until(
                functools.partial(succeeded, task_name, result_id),
                timeout=60,
                interval=0.2,
                message=lambda name=task_name: f"{name} to succeed: { {n: log(n) for n in procs} }",
            )
            assert found["return_value"] == value

        # The recovery loops run in rundispatcher's child process (started from the project's manage.py):
        # their ticks reach the parent's heartbeat rows, and the parent saw no child death.
        def ticked():
            loops = recovery_loops(database)
            return loops if loops.get("recovery-thumbnails", (None,))[0] is not None else None

        loops = wait_until(ticked, timeout=60, interval=0.5, message=lambda: f"the loops' ticks:\n{log('dispatcher')}")
        assert loops["recovery-process"][1:] == (0, ""), loops
        # The project configures no logging (startproject's settings): our INFO lines still reach stderr, each
        # naming its action (runtime.default_logging).
        assert "action=recovery_process_started domain=recovery" in (tmp_path / "dispatcher.log").read_text()
        assert "action=runworkers_start domain=worker" in (tmp_path / "workers.log").read_text()
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} exited:\n{(tmp_path / f'{name}.log').read_text()}"
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for handle in logs.values():
            handle.close()

    # Exactly the view's two tasks: the rolled-back enqueue left no job behind.
    with connect(database) as conn:
        queues = conn.execute("SELECT domain, status FROM dispatch_app_job ORDER BY id").fetchall()
    assert queues == [("default", "succeeded"), ("thumbnails", "succeeded")]
    worker_log = (tmp_path / "workers.log").read_text()
    assert "thumbnails" in worker_log, worker_log
    assert not [d for d in DEMO_DOMAINS if d in worker_log], worker_log

    dashboard = run([python, "manage.py", "shell", "-c", ADMIN_CHECK], cwd=project, env=env)
    assert "DASHBOARD 200\n" in dashboard, dashboard[:2000]
    assert "thumbnails" in dashboard
    assert not [d for d in DEMO_DOMAINS if d in dashboard], "a demo domain shows in a new project's dashboard"
