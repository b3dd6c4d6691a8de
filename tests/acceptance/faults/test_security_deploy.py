"""Security of a deployment (issue 6): what production settings, the repository and the URLs guarantee.

- ``check --deploy`` is clean in production mode; production refuses to start
  without SECRET_KEY, with DEBUG on, or without DATABASE_URL / REDIS_URL (no
  embedded servers); with DEBUG off the admin's static files are served after
  collectstatic (WhiteNoise); nothing secret is committed.
- TLS and auth for PostgreSQL and Redis come through the URLs.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess

import pytest

from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(180),
    pytest.mark.version_dependent,
    pytest.mark.path_dependent,
]


# --- production settings -----------------------------------------------------
PLACEHOLDER_DATABASE_URL = "postgresql://pf:pg-pw@db.example.invalid:5432/productflow"
PLACEHOLDER_REDIS_URL = "redis://:redis-pw@redis.example.invalid:6379/0"


def _manage(
    env_overrides: dict, *args: str, drop: tuple[str, ...] = (), unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    for name in ("SECRET_KEY", "DEBUG", "PRODUCTFLOW_ENV", "ALLOWED_HOSTS", *drop):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE="productflow.settings",
        # Never connected to by these commands; a URL keeps settings from starting the embedded servers. With
        # passwords: production refuses a server URL without one.
        DATABASE_URL=PLACEHOLDER_DATABASE_URL,
        REDIS_URL=PLACEHOLDER_REDIS_URL,
    )
    env.update(env_overrides)
    for name in unset:
        env.pop(name, None)
    return subprocess.run(
        [PYTHON, MANAGE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


PRODUCTION = {"PRODUCTFLOW_ENV": "production", "DEBUG": "0", "ALLOWED_HOSTS": "example.com"}


def test_check_deploy_is_clean_in_production_mode():
    key = secrets.token_urlsafe(50)
    result = _manage({**PRODUCTION, "SECRET_KEY": key}, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    # The check bites: a weak key is reported (so "clean" above means something).
    weak = _manage({**PRODUCTION, "SECRET_KEY": "short"}, "check", "--deploy", "--fail-level", "WARNING")
    assert weak.returncode != 0 and "security.W009" in weak.stderr + weak.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "SECRET_KEY must be set when PRODUCTFLOW_ENV=production"),
        ({"SECRET_KEY": "x" * 60, "DEBUG": "1"}, "DEBUG must be off when PRODUCTFLOW_ENV=production"),
    ],
    ids=["no-secret-key", "debug-on"],
)
def test_production_refuses_to_start_unsafe(overrides, message):
    result = _manage({**PRODUCTION, **overrides}, "check")
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("unset", "message"),
    [
        (("DATABASE_URL",), "DATABASE_URL must be set when PRODUCTFLOW_ENV=production"),
        (("REDIS_URL",), "REDIS_URL must be set when PRODUCTFLOW_ENV=production"),
        (("DATABASE_URL", "REDIS_URL"), "DATABASE_URL and REDIS_URL must be set when PRODUCTFLOW_ENV=production"),
    ],
    ids=["no-database-url", "no-redis-url", "neither"],
)
def test_production_refuses_the_embedded_servers(tmp_path, unset, message):
    embedded_dir = tmp_path / "embedded"
    env = {**PRODUCTION, "SECRET_KEY": secrets.token_urlsafe(50), "PRODUCTFLOW_EMBEDDED_DIR": str(embedded_dir)}
    result = _manage(env, "check", unset=unset)
    assert result.returncode != 0
    assert message in result.stderr and "for development only" in result.stderr
    assert not embedded_dir.exists()  # refused before anything was started


SERVE_LOGIN_AND_ITS_CSS = r"""
import json, re, sys
from io import BytesIO
from productflow.wsgi import application

def get(path):
    status = {}
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "example.com",
               "SERVER_PORT": "443", "HTTP_HOST": "example.com", "wsgi.url_scheme": "https",
               "wsgi.input": BytesIO(), "wsgi.errors": sys.stderr, "SERVER_PROTOCOL": "HTTP/1.1"}
    body = b"".join(application(environ, lambda s, headers, exc=None: status.update(s=s, h=dict(headers))))
    return status["s"], status["h"], body

status, _, page = get("/admin/login/")
assert status.startswith("200"), status
css = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page).group(1).decode()
status, headers, body = get(css)
print(json.dumps([status, headers.get("Content-Type"), headers.get("Cache-Control"), len(body)]))
"""


def test_with_debug_off_the_admin_static_files_are_served_after_collectstatic(tmp_path):
    static_root = tmp_path / "static"
    env = {**PRODUCTION, "SECRET_KEY": secrets.token_urlsafe(50), "STATIC_ROOT": str(static_root)}
    collected = _manage(env, "collectstatic", "--noinput")
    assert collected.returncode == 0, collected.stderr
    assert (static_root / "staticfiles.json").exists()  # the manifest of hashed names the pages link to

    import os

    served = subprocess.run(
        [PYTHON, "-c", SERVE_LOGIN_AND_ITS_CSS],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("DEBUG", "ALLOWED_HOSTS")},
            "DJANGO_SETTINGS_MODULE": "productflow.settings",
            "DATABASE_URL": PLACEHOLDER_DATABASE_URL,
            "REDIS_URL": PLACEHOLDER_REDIS_URL,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 0, served.stderr
    status, content_type, cache_control, size = json.loads(served.stdout.strip().splitlines()[-1])
    assert status == "200 OK" and content_type.startswith("text/css")
    assert "immutable" in cache_control  # a hashed name: cacheable forever
    assert size > 1000


# --- committed secrets ---------------------------------------------------------
PLACEHOLDER_PASSWORDS = {"password", "postgres", "pw", "secret", "changeme", "example", "pass", "xxx", "redis"}
SECRET_PATTERNS = {
    "private key": re.compile("-----BEGIN [A-Z ]*" + "PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "Stripe/OpenAI-style key": re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|\bsk-[A-Za-z0-9]{32,}\b"),
    "hard-coded SECRET_KEY": re.compile(r"""SECRET_KEY\s*[=:]\s*['"](?!development-only-not-secret)[^'"]{16,}['"]"""),
}
URL_CREDENTIALS = re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]+:([^/\s@'\"]+)@([^/\s:?'\"]*)")
# Hosts reserved for documentation and tests (RFC 2606/6761): credentials there are examples.
EXAMPLE_HOSTS = re.compile(r"(^|\.)(example\.(com|org|net)|example|invalid|test|localhost)$")
SECRET_FILES = re.compile(r"(^|/)(\.env(\..+)?|id_rsa|id_ed25519|.*\.pem|.*\.key|.*\.p12|\.pgpass|\.netrc)$")


def find_secrets(files: dict[str, str]) -> list[str]:
    found = []
    for path, text in files.items():
        if SECRET_FILES.search(path) and not path.endswith(".env.example"):
            found.append(f"{path}: a credentials file")
        for name, pattern in SECRET_PATTERNS.items():
            for match in pattern.finditer(text):
                found.append(f"{path}: {name} ({match.group(0)[:12]}...)")
        for match in URL_CREDENTIALS.finditer(text):
            password, host = match.group(1), match.group(2)
            if EXAMPLE_HOSTS.search(host):
                continue
            if password.lower() not in PLACEHOLDER_PASSWORDS and not password.startswith(("$", "<", "{", "%(")):
                found.append(f"{path}: a password in a URL ({match.group(0)[:20]}...)")
    return found


def test_no_secret_or_credential_is_committed():
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
    ).stdout.split(b"\0")
    files = {}
    for raw in filter(None, listed):
        path = ROOT / raw.decode()
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8000]:
            continue  # binary (images)
        files[raw.decode()] = data.decode(errors="replace")
    assert len(files) > 20, "the scan saw almost nothing: is this the repository?"
    assert find_secrets(files) == []


def test_the_secret_scan_can_fail():
    planted = {
        "a.py": "AWS = '" + "AKIA" + "ABCDEFGHIJKLMNOP'",
        "b.md": "DATABASE_URL=postgres://app:" + "s3cr3t-Pa55" + "@db.internal/prod",
        "c/id_rsa": "-----BEGIN OPENSSH " + "PRIVATE KEY-----",
        "settings.py": "SECRET_KEY = '" + "k" * 40 + "'",
        "ok.md": "postgres://user:password@db.example.com/x and redis://:${REDIS_PASSWORD}@r/0",
    }
    found = find_secrets(planted)
    assert {f.split(":")[0] for f in found} == {"a.py", "b.md", "c/id_rsa", "settings.py"}, found


# --- TLS and auth through the URLs ---------------------------------------------------
PARSE_SETTINGS = """
import json, redis
from django.conf import settings
from django.db import connection
params = connection.get_connection_params()
pool = redis.Redis.from_url(settings.RQ_QUEUES["delivery"]["URL"]).connection_pool
print(json.dumps({
    "pg": {k: params.get(k) for k in ("host", "port", "user", "password", "dbname", "sslmode", "sslrootcert")},
    "redis_class": pool.connection_class.__name__,
    "redis": {k: pool.connection_kwargs.get(k) for k in ("host", "port", "username", "password", "db",
                                                         "ssl_cert_reqs", "ssl_ca_certs", "socket_timeout")},
}))
"""


def test_tls_and_auth_are_configured_through_the_urls():
    result = _manage(
        {
            "DATABASE_URL": "postgresql://pf_app:p%40ss%3Aword@db.example.com:6432/productflow"
            "?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem",
            "REDIS_URL": "rediss://pf:r%40dis-pw@redis.example.com:6380/2"
            "?ssl_cert_reqs=required&ssl_ca_certs=/etc/ssl/redis-ca.pem",
        },
        "shell",
        "-c",
        PARSE_SETTINGS,
    )
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["pg"] == {
        "host": "db.example.com",
        "port": 6432,
        "user": "pf_app",
        "password": "p@ss:word",
        "dbname": "productflow",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ssl/pg-ca.pem",
    }
    assert parsed["redis_class"] == "SSLConnection"
    redis_kwargs = parsed["redis"]
    assert redis_kwargs["host"] == "redis.example.com" and redis_kwargs["port"] == 6380 and redis_kwargs["db"] == 2
    assert redis_kwargs["username"] == "pf" and redis_kwargs["password"] == "r@dis-pw"
    assert redis_kwargs["ssl_cert_reqs"] == "required" and redis_kwargs["ssl_ca_certs"] == "/etc/ssl/redis-ca.pem"
    assert redis_kwargs["socket_timeout"] == 5.0, "our timeouts are added to a URL that carries its own options"
