"""Production is safe by default (issue 26.4): the environment names a known mode, a 500 page shows no
credentials, the proxy's HTTPS header is trusted only when configured, and the compose configuration
passes ``check --deploy``. Settings are read in child processes (they are read once per process)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys

import pytest
from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter

from productflow.reporting import MASK, mask_credentials
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = pytest.mark.version_dependent

COMPOSE = ROOT / "docker" / "compose.yaml"
ENV_EXAMPLE = ROOT / "docker" / "productflow.env.example"
# With passwords: production refuses a server URL without one (tests/unit/test_production_refusals.py).
PLACES = {
    "DATABASE_URL": "postgresql://pf:pg-pw@db.example.invalid:5432/productflow",
    "REDIS_URL": "redis://:redis-pw@r.invalid/0",
}


def run(env: dict, *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "REDIS_URL", "SECURE_"))}
    for name in ("SECRET_KEY", "DEBUG", "PRODUCTFLOW_ENV", "ALLOWED_HOSTS", "DATABASE_URL"):
        base.pop(name, None)
    base.update(DJANGO_SETTINGS_MODULE="productflow.settings", **PLACES)
    base.update(env)
    return subprocess.run([PYTHON, *args], cwd=ROOT, env=base, capture_output=True, text=True, timeout=90, check=False)


def setting(env: dict, name: str) -> str:
    code = f"import django; django.setup(); from django.conf import settings; print(repr(settings.{name}))"
    result = run(env, "-c", code)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["Production", "prod", "staging", " production"])
def test_an_unknown_environment_is_refused_naming_the_known_ones(value):
    result = run({"PRODUCTFLOW_ENV": value}, MANAGE, "check")
    assert result.returncode != 0
    assert f"PRODUCTFLOW_ENV={value!r} is not one of development, production" in result.stderr


def test_the_proxy_ssl_header_is_trusted_only_when_configured():
    production = {"PRODUCTFLOW_ENV": "production", "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50)}
    assert setting(production, "SECURE_PROXY_SSL_HEADER") == "None"
    configured = {**production, "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"}
    assert setting(configured, "SECURE_PROXY_SSL_HEADER") == "('HTTP_X_FORWARDED_PROTO', 'https')"
    bad = run({**production, "SECURE_PROXY_SSL_HEADER": "https"}, MANAGE, "check")
    assert bad.returncode != 0 and "is not 'Header-Name: value'" in bad.stderr


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgres://app:s3cr3t@db.example.com:5432/prod", f"postgres://app:{MASK}@db.example.com:5432/prod"),
        (
            "redis://:p%40ss@r.example.com:6379/0?socket_timeout=5",
            f"redis://:{MASK}@r.example.com:6379/0?socket_timeout=5",
        ),
        (
            "rediss://user:pw@r.example.com:1/0 and postgres://a:b@h.example.com/d",
            f"rediss://user:{MASK}@r.example.com:1/0 and postgres://a:{MASK}@h.example.com/d",
        ),
        ("redis://r:6379/0?password=hunter2&db=1", f"redis://r:6379/0?password={MASK}&db=1"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
    ],
)
def test_url_passwords_are_masked(text, shown):
    assert mask_credentials(text) == shown


# Built, not written out: the page shows the failing frame's source lines, and these must be found only where a
# setting, a variable or the request carries them. Module-level: a list of them in the failing frame would be
# shown as a local variable, and rightly so.
S = "S3cret"
SECRETS = tuple(f"{where}{S}" for where in ("pg", "redis", "lane", "local", "meta"))


def test_a_500_page_with_debug_on_shows_no_credential():
    queues = {"default": {"URL": f"redis://:redis{S}@r.example.com:6379/0"}}
    queues["delivery"] = {"URL": f"redis://:lane{S}@r2.example.com:6379/0"}
    request = RequestFactory().get("/admin/", REDIS_URL_DELIVERY=f"redis://:meta{S}@r2.example.com/0")
    with override_settings(
        DEBUG=True,
        DATABASE_URL=f"postgres://pf:pg{S}@db.example.com/pf",
        REDIS_URL=f"redis://:redis{S}@r.example.com:6379/0",
        RQ_QUEUES=queues,
    ):
        try:
            url = f"redis://:local{S}@r.example.com/0"  # noqa: F841 - a local variable of the failing frame
            raise RuntimeError("boom")
        except RuntimeError:
            html = ExceptionReporter(request, *sys.exc_info()).get_traceback_html()
    assert "boom" in html and "r2.example.com" in html and MASK in html
    shown = [value for value in SECRETS if value in html]
    assert not shown, f"credentials on the 500 page: {shown}"


def compose_environment() -> dict[str, str]:
    """What docker/compose.yaml gives the app containers: x-app's environment plus the env file, its <...>
    placeholders filled with fresh secrets (the same placeholder, the same value, as the example says)."""
    text = COMPOSE.read_text()
    block = re.search(r"^x-app:.*?^  environment:\n((?:    .*\n)+)", text, re.MULTILINE | re.DOTALL)
    assert block, "x-app has no environment block"
    env = {}
    for line in block.group(1).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            env[key.strip()] = value.strip().strip('"')
    fills: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key] = re.sub(r"<[^>]*>", lambda m: fills.setdefault(m.group(), secrets.token_urlsafe(50)), value)
    return env


def test_the_compose_configuration_passes_check_deploy():
    env = compose_environment()
    assert env["PRODUCTFLOW_ENV"] == "production" and env["DEBUG"] == "0"
    assert "change-me" not in COMPOSE.read_text() and not re.search(r"SECRET_KEY *:", COMPOSE.read_text())
    # Redis with a password, and every URL the project builds from REDIS_URL carries it.
    assert "--requirepass" in COMPOSE.read_text() and env["REDIS_URL"].startswith("redis://:")
    assert re.search(r'"\$\{PRODUCTFLOW_BIND:-127\.0\.0\.1\}:', COMPOSE.read_text()), "not bound to localhost"
    result = run(env, MANAGE, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    # Every queue's connection (the dispatcher's sends, the workers, the dashboard read them all from RQ_QUEUES)
    # carries its server's password, a per-domain server's (REDIS_URL_<QUEUE>) its own.
    env["REDIS_URL_DELIVERY"] = "redis://:delivery-" + env["REDIS_PASSWORD"] + "@redis-delivery:6379/0"
    code = (
        "import django, json; django.setup(); from dispatch_app.domains import queue_names; "
        "from dispatch_app.rq import servers as redis_servers; print(json.dumps({q: redis_servers.queue_connection(q)"
        ".connection_pool.connection_kwargs.get('password') for q in queue_names()}))"
    )
    checked = run(env, "-c", code)
    assert checked.returncode == 0, checked.stderr
    passwords = json.loads(checked.stdout.strip().splitlines()[-1])
    assert passwords.pop("delivery") == "delivery-" + env["REDIS_PASSWORD"]
    assert passwords and set(passwords.values()) == {env["REDIS_PASSWORD"]}, passwords
