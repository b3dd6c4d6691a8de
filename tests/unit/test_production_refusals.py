"""Production refuses unsafe settings (issue 56.5): a weak or placeholder SECRET_KEY, ALLOWED_HOSTS "*" or empty,
DEBUG on, and PostgreSQL/Redis URLs without a password unless ``PRODUCTFLOW_ALLOW_NO_PASSWORD`` says so; a
compliant environment still passes ``check --deploy``; the compose file's Redis refuses an empty password.

Settings are read once per process: each environment is tried in a child process, as
tests/unit/test_production_safety.py does. Which URLs authenticate another way (a unix socket, a TLS client
certificate, libpq's own password sources) is shown on the functions directly."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from productflow import production_safety
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = pytest.mark.version_dependent

ENV_EXAMPLE = ROOT / "docker" / "productflow.env.example"
COMPOSE = ROOT / "docker" / "compose.yaml"
KEY = secrets.token_urlsafe(50)
DATABASE_URL = "postgresql://pf:pg-pw@db.example.invalid:5432/productflow"
REDIS_URL = "redis://:redis-pw@redis.example.invalid:6379/0"
COMPLIANT = {
    "PRODUCTFLOW_ENV": "production",
    "DEBUG": "0",
    "SECRET_KEY": KEY,
    "ALLOWED_HOSTS": "example.com",
    "DATABASE_URL": DATABASE_URL,
    "REDIS_URL": REDIS_URL,
}
# Whatever the outer environment carries that these settings read (libpq's own variables included).
_READ = ("SECRET_KEY", "DEBUG", "PRODUCTFLOW_", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL", "DISPATCH_", "SECURE_")
_READ += ("PGPASSWORD", "PGPASSFILE", "PGHOST")


def manage(overrides: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_READ)}
    env.update(DJANGO_SETTINGS_MODULE="productflow.settings", **COMPLIANT)
    env.update(overrides)
    return subprocess.run(
        [PYTHON, MANAGE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False
    )


def example_value(name: str) -> str:
    [value] = [line.split("=", 1)[1] for line in ENV_EXAMPLE.read_text().splitlines() if line.startswith(name + "=")]
    return value


REFUSED = {
    "key-short": ({"SECRET_KEY": "x"}, "SECRET_KEY is too weak when PRODUCTFLOW_ENV=production (security.W009"),
    "key-49": ({"SECRET_KEY": KEY[:49]}, "SECRET_KEY is too weak"),
    "key-4-different": ({"SECRET_KEY": "abcd" * 20}, "it has 80 characters, 4 different"),
    "key-django-insecure": ({"SECRET_KEY": "django-insecure-" + KEY}, "no 'django-insecure-' prefix"),
    "key-example": ({"SECRET_KEY": example_value("SECRET_KEY")}, "SECRET_KEY is still the example's <...> placeholder"),
    "key-development": ({"SECRET_KEY": "development-only-not-secret"}, "SECRET_KEY is the development key"),
    "hosts-star": ({"ALLOWED_HOSTS": "*"}, "ALLOWED_HOSTS contains '*'"),
    "hosts-star-among": ({"ALLOWED_HOSTS": "example.com, *"}, "ALLOWED_HOSTS contains '*'"),
    "hosts-empty": ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS is empty"),
    "hosts-blank": ({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is empty"),
    "debug": ({"DEBUG": "1"}, "DEBUG must be off when PRODUCTFLOW_ENV=production"),
    "pg-no-password": ({"DATABASE_URL": "postgresql://pf@db.example.invalid/pf"}, "DATABASE_URL has no password"),
    "pg-empty-password": ({"DATABASE_URL": "postgresql://pf:@db.example.invalid/pf"}, "DATABASE_URL has no password"),
    "pg-example": ({"DATABASE_URL": example_value("DATABASE_URL")}, "DATABASE_URL still has the example's <...>"),
    "pg-cert-no-tls": (
        {"DATABASE_URL": "postgresql://pf@db.example.invalid/pf?sslmode=prefer&sslcert=/c.crt"},
        "DATABASE_URL has no password",
    ),
    "redis-no-password": ({"REDIS_URL": "redis://redis.example.invalid:6379/0"}, "REDIS_URL has no password"),
    "redis-user-only": ({"REDIS_URL": "redis://pf@redis.example.invalid:6379/0"}, "REDIS_URL has no password"),
    "redis-example": ({"REDIS_URL": example_value("REDIS_URL")}, "REDIS_URL still has the example's <...>"),
    "redis-tls-no-cert": ({"REDIS_URL": "rediss://redis.example.invalid:6380/0"}, "REDIS_URL has no password"),
    "redis-queue": ({"REDIS_URL_DELIVERY": "redis://r2.example.invalid/0"}, "REDIS_URL_DELIVERY has no password"),
    "allow-unknown": ({"PRODUCTFLOW_ALLOW_NO_PASSWORD": "mysql"}, "PRODUCTFLOW_ALLOW_NO_PASSWORD='mysql' names"),
    # Allowing one server's lack of a password does not allow the other's.
    "allow-other-server": (
        {"PRODUCTFLOW_ALLOW_NO_PASSWORD": "postgres", "REDIS_URL": "redis://redis.example.invalid/0"},
        "REDIS_URL has no password",
    ),
}


FIXES = (
    "set a random one (python -c 'import secrets; print(secrets.token_urlsafe(50))')",
    "name the host names the site is served at (ALLOWED_HOSTS=example.com",
    "DEBUG must be off",
    "put the server's password in it (scheme://user:password@host/...), or set PRODUCTFLOW_ALLOW_NO_PASSWORD=",
    "it takes postgres and/or redis, comma-separated",
)


@pytest.mark.parametrize(("overrides", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_production_refuses_each_unsafe_setting_naming_it(overrides, message):
    result = manage(overrides, "check")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: ") and message in last, result.stderr
    # One line naming the setting and what to do (FIXES), never the secret or the URL itself.
    assert any(fix in last for fix in FIXES), last
    for name, value in overrides.items():
        if name != "ALLOWED_HOSTS" and len(value) > 8:
            assert value not in result.stderr, f"{name}'s value is echoed"


def test_a_compliant_production_environment_passes_check_deploy():
    result = manage({}, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_servers_allowed_without_a_password_start_and_pass_check_deploy():
    passwordless = {
        "PRODUCTFLOW_ALLOW_NO_PASSWORD": "postgres, Redis",
        "DATABASE_URL": "postgresql://pf@db.example.invalid/pf",
        "REDIS_URL": "redis://redis.example.invalid/0",
        "REDIS_URL_DELIVERY": "redis://r2.example.invalid/0",
    }
    result = manage(passwordless, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("url", "environ"),
    [
        ("postgresql://pf@%2Fvar%2Frun%2Fpostgresql/pf", {}),  # a socket directory as the host: peer auth
        ("postgresql://pf@/pf?host=/var/run/postgresql", {}),
        ("postgresql:///pf", {}),  # no host at all: libpq's default socket
        ("postgresql://pf@db.example.invalid/pf?sslmode=verify-full&sslcert=/c.crt&sslkey=/c.key", {}),
        ("postgresql://pf@db.example.invalid/pf?password=pw", {}),
        ("postgresql://pf@db.example.invalid/pf?passfile=/run/secrets/pgpass", {}),
        ("postgresql://pf@db.example.invalid/pf", {"PGPASSWORD": "pw"}),
        ("postgresql://pf@db.example.invalid/pf", {"PGPASSFILE": "/run/secrets/pgpass"}),
    ],
)
def test_postgres_urls_that_authenticate_another_way_pass(url, environ):
    production_safety.check_postgres_url("DATABASE_URL", url, environ)


def test_a_socket_url_with_a_network_pghost_is_no_socket():
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL has no password"):
        production_safety.check_postgres_url("DATABASE_URL", "postgresql:///pf", {"PGHOST": "db.example.invalid"})


@pytest.mark.parametrize(
    "url",
    [
        "unix:///run/redis/redis.sock?db=0",
        "rediss://redis.example.invalid:6380/0?ssl_certfile=/c.crt&ssl_keyfile=/c.key",
        "redis://redis.example.invalid/0?password=pw",
        "redis://pf:pw@redis.example.invalid/0",
    ],
)
def test_redis_urls_that_authenticate_another_way_pass(url):
    production_safety.check_redis_url("REDIS_URL", url)


# --- docker/compose.yaml: Redis refuses to start without a password ----------------------------
def redis_script() -> str:
    """The redis service's `sh -c` script as the container's shell gets it (compose turns `$$` into `$`)."""
    block = re.search(r"^  redis:\n(.*?)^  \S", COMPOSE.read_text(), re.MULTILINE | re.DOTALL)
    assert block, "no redis service"
    script = re.search(r"      - sh\n      - -c\n      - \|\n((?:        .*\n)+)", block.group(1))
    assert script, "the redis command is no longer a `sh -c` block"
    text = "".join(line[8:] + "\n" for line in script.group(1).splitlines())
    # A lone `$` would be interpolated by compose from the shell that runs compose, not the container's env_file.
    assert not re.search(r"(?<!\$)\$(?!\$)", text), "a `$` compose would interpolate"
    return text.replace("$$", "$")


@pytest.mark.parametrize(
    ("password", "message"),
    [
        (None, "REDIS_PASSWORD is empty"),
        ("", "REDIS_PASSWORD is empty"),
        ("<redis-password>", "REDIS_PASSWORD is the <...> placeholder"),
    ],
    ids=["unset", "empty", "placeholder"],
)
def test_compose_redis_refuses_an_empty_or_placeholder_password(tmp_path, password, message):
    result = run_redis_script(tmp_path, password)
    assert result.returncode == 1 and message in result.stderr
    assert not (tmp_path / "started").exists(), "redis-server was started"


def test_compose_redis_starts_with_its_password(tmp_path):
    result = run_redis_script(tmp_path, "s3cret pw")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "started").read_text().splitlines()[-2:] == ["--requirepass", "s3cret pw"]


def run_redis_script(tmp_path: Path, password: str | None) -> subprocess.CompletedProcess:
    # A stand-in redis-server that records its arguments (one a line): the script must `exec` it with them.
    stub = tmp_path / "redis-server"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "started"}\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    if password is not None:
        env["REDIS_PASSWORD"] = password
    return subprocess.run(["sh", "-c", redis_script()], env=env, capture_output=True, text=True, timeout=30)
