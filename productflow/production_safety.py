"""Refuses production settings that are unsafe to run with: a weak or placeholder SECRET_KEY, a wildcard or empty
ALLOWED_HOSTS, and PostgreSQL/Redis URLs that authenticate with nothing.

``settings.py`` calls ``refuse_unsafe`` when ``PRODUCTFLOW_ENV=production``. Each refusal is one
``ImproperlyConfigured`` line naming the setting and what to do; a secret or a URL is never echoed (the message
goes to logs). Plain functions over the environment: Django's settings are not loaded yet.

A server URL passes when it carries a password (``user:password@`` or ``?password=``; PostgreSQL also
``?passfile=``, ``PGPASSWORD``, ``PGPASSFILE``), a TLS client certificate (PostgreSQL ``?sslcert=`` with
``sslmode=require|verify-ca|verify-full``; ``rediss://`` with ``?ssl_certfile=``), or goes through a unix socket
(PostgreSQL's peer authentication, Redis' socket permissions: only processes on that host reach it). Anything
else needs ``PRODUCTFLOW_ALLOW_NO_PASSWORD`` (``postgres``, ``redis`` or both, comma-separated): e.g. a
``~/.pgpass`` file libpq finds by itself, or a network this deployment trusts. README "Settings" documents it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import parse_qs, unquote, urlsplit

import dj_database_url
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
from django.core.exceptions import ImproperlyConfigured

WHERE = "when PRODUCTFLOW_ENV=production"
DEVELOPMENT_KEY = "development-only-not-secret"  # noqa: S105 - the key development mode uses; refused here
ALLOW_NO_PASSWORD = "PRODUCTFLOW_ALLOW_NO_PASSWORD"  # noqa: S105 - a setting's name
SERVERS = ("postgres", "redis")
NEW_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
# An example file's "<...>" left in place (docker/productflow.env.example: SECRET_KEY=<50+ random characters>,
# <postgres-password>, <redis-password>), also percent-encoded in a URL.
_PLACEHOLDER = re.compile(r"\A\s*<[^<>]*>\s*\Z")
_TLS_CERT_MODES = {"require", "verify-ca", "verify-full"}


def refuse_unsafe(environ: Mapping[str, str], *, secret_key: str, allowed_hosts: list[str]) -> None:
    """Raise ``ImproperlyConfigured`` for the first unsafe production setting; return if there is none."""
    check_secret_key(secret_key)
    check_allowed_hosts(allowed_hosts)
    allowed = allowed_without_password(environ.get(ALLOW_NO_PASSWORD, ""))
    if "postgres" not in allowed:
        check_postgres_url("DATABASE_URL", environ.get("DATABASE_URL", ""), environ)
    if "redis" not in allowed:
        # Every server a queue may live on: REDIS_URL, and each REDIS_URL_<QUEUE> (empty ones are unused).
        for name in sorted(n for n in environ if n == "REDIS_URL" or n.startswith("REDIS_URL_")):
            if environ[name]:
                check_redis_url(name, environ[name])


def check_secret_key(key: str) -> None:
    if _PLACEHOLDER.match(key):
        raise ImproperlyConfigured(
            f"SECRET_KEY is still the example's <...> placeholder {WHERE}: set a random one ({NEW_KEY})"
        )
    if key == DEVELOPMENT_KEY:
        raise ImproperlyConfigured(f"SECRET_KEY is the development key {WHERE}: set a random one ({NEW_KEY})")
    # Django's own rule (check --deploy, security.W009), so a key that starts is one check --deploy accepts.
    if (
        len(key) < SECRET_KEY_MIN_LENGTH
        or len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS
        or key.startswith(SECRET_KEY_INSECURE_PREFIX)
    ):
        raise ImproperlyConfigured(
            f"SECRET_KEY is too weak {WHERE} (security.W009: at least {SECRET_KEY_MIN_LENGTH} characters, "
            f"{SECRET_KEY_MIN_UNIQUE_CHARACTERS} different, no {SECRET_KEY_INSECURE_PREFIX!r} prefix; "
            f"it has {len(key)} characters, {len(set(key))} different): set a random one ({NEW_KEY})"
        )


def check_allowed_hosts(hosts: list[str]) -> None:
    if not hosts:
        raise ImproperlyConfigured(
            f"ALLOWED_HOSTS is empty {WHERE}: name the host names the site is served at (ALLOWED_HOSTS=example.com)"
        )
    if any("*" in host for host in hosts):
        raise ImproperlyConfigured(
            f"ALLOWED_HOSTS contains '*' {WHERE}: name the host names the site is served at "
            "(ALLOWED_HOSTS=example.com; '.example.com' for its subdomains)"
        )


def allowed_without_password(raw: str) -> set[str]:
    """The servers ``PRODUCTFLOW_ALLOW_NO_PASSWORD`` lets connect without a password (postgres, redis)."""
    names = {n.strip().lower() for n in raw.split(",") if n.strip()}
    unknown = sorted(names - set(SERVERS))
    if unknown:
        raise ImproperlyConfigured(
            f"{ALLOW_NO_PASSWORD}={raw[:80]!r} names {', '.join(map(repr, unknown))}: "
            f"it takes {' and/or '.join(SERVERS)}, comma-separated"
        )
    return names


def _refused(name: str, why: str, server: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"{name} {why} {WHERE}: put the server's password in it (scheme://user:password@host/...), "
        f"or set {ALLOW_NO_PASSWORD}={server} if it authenticates another way (README 'Settings')"
    )


def check_postgres_url(name: str, url: str, environ: Mapping[str, str]) -> None:
    try:
        parsed = dj_database_url.parse(url)
    except ValueError:
        return  # settings.py reports an unparsable URL itself, naming it
    options = parsed.get("OPTIONS") or {}
    password = parsed.get("PASSWORD") or options.get("password") or ""
    if _PLACEHOLDER.match(password):
        raise _refused(name, "still has the example's <...> placeholder password", "postgres")
    if password or options.get("passfile") or environ.get("PGPASSWORD") or environ.get("PGPASSFILE"):
        return
    if options.get("sslcert") and options.get("sslmode") in _TLS_CERT_MODES:
        return  # a TLS client certificate (pg_hba "cert")
    hosts = str(options.get("host") or parsed.get("HOST") or environ.get("PGHOST") or "")
    if all(h.startswith(("/", "@")) for h in hosts.split(",")) or not hosts:
        return  # a unix socket (no host: libpq's default socket): peer authentication, this host only
    raise _refused(name, "has no password (nor a TLS client certificate, nor a unix socket)", "postgres")


def check_redis_url(name: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        password = unquote(parts.password or "") or (query.get("password") or [""])[0]
    except ValueError:
        return  # redis-py reports an unparsable URL when the queue's connection is made
    if _PLACEHOLDER.match(password):
        raise _refused(name, "still has the example's <...> placeholder password", "redis")
    if password or parts.scheme == "unix":
        return
    if parts.scheme == "rediss" and query.get("ssl_certfile"):
        return  # a TLS client certificate (tls-auth-clients)
    raise _refused(name, "has no password (nor a TLS client certificate, nor a unix socket)", "redis")
