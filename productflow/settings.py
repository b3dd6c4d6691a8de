"""Settings, read from the environment.

DATABASE_URL / REDIS_URL unset -> the embedded default (productflow.embedded).
Production mode (PRODUCTFLOW_ENV=production) refuses to start without a
SECRET_KEY or with DEBUG on.
"""

from __future__ import annotations

import json
import os
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


PRODUCTION = os.environ.get("PRODUCTFLOW_ENV", "development") == "production"
DEBUG = _env_bool("DEBUG", not PRODUCTION)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if PRODUCTION:
    if not SECRET_KEY:
        raise ImproperlyConfigured("SECRET_KEY must be set when PRODUCTFLOW_ENV=production")
    if DEBUG:
        raise ImproperlyConfigured("DEBUG must be off when PRODUCTFLOW_ENV=production")
elif not SECRET_KEY:
    SECRET_KEY = "development-only-not-secret"  # noqa: S105 - refused in production above

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgtrigger",
    "django_rq",
    "dispatch_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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

# --- PostgreSQL -------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if not DATABASE_URL:
    from productflow import embedded

    DATABASE_URL = embedded.postgres_url()
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
REDIS_URL = os.environ.get("REDIS_URL", "")
if not REDIS_URL:
    from productflow import embedded

    REDIS_URL = embedded.redis_url()
REDIS_SOCKET_TIMEOUT = float(os.environ.get("REDIS_SOCKET_TIMEOUT", "5"))


def _with_timeouts(url: str) -> str:
    """Every Redis call of ours is bounded: redis-py reads these from the URL."""
    sep = "&" if "?" in url else "?"
    extra = [
        f"{key}={value}"
        for key, value in (
            ("socket_timeout", REDIS_SOCKET_TIMEOUT),
            ("socket_connect_timeout", REDIS_SOCKET_TIMEOUT),
            ("health_check_interval", 30),
        )
        if f"{key}=" not in url
    ]
    return url + (sep + "&".join(extra) if extra else "")


REDIS_URL = _with_timeouts(REDIS_URL)

from dispatch_app.domains import QUEUE_NAMES  # noqa: E402 - needs nothing from Django

_QUEUE_CONFIG = {
    "URL": REDIS_URL,
    "DEFAULT_TIMEOUT": 600,
    # JSON, never pickle: a job planted in Redis must not be able to run code.
    "SERIALIZER": "rq.serializers.JSONSerializer",
}
RQ_QUEUES = {name: dict(_QUEUE_CONFIG) for name in ("default", *QUEUE_NAMES)}
# The dispatcher enqueues outside any transaction; "auto" keeps django-rq from
# deferring an enqueue to on_commit behind our back.
RQ = {"COMMIT_MODE": "auto"}

# --- Dispatcher (dispatch_app.conf documents and validates every key) ------
# Each key can be set from the environment as DISPATCH_<KEY>, its value JSON
# (a number, or an object for DISPATCH_RECOVERY).
DISPATCH = {}
for _name, _raw in os.environ.items():
    if _name.startswith("DISPATCH_"):
        try:
            DISPATCH[_name.removeprefix("DISPATCH_")] = json.loads(_raw)
        except ValueError:
            raise ImproperlyConfigured(f"{_name}={_raw!r} is not valid JSON (a number, or an object)") from None

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", BASE_DIR / "var" / "media"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if PRODUCTION:
    SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"pgserver": {"level": "WARNING"}},
}
