"""With DEBUG off the WSGI app serves the admin's static files from STATIC_ROOT (WhiteNoise), after collectstatic."""

from __future__ import annotations

import io

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.test import override_settings

pytestmark = pytest.mark.version_dependent


def get(app, path: str) -> tuple[str, bytes]:
    seen = {}
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "HTTP_HOST": "localhost",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": io.StringIO(),
        "SERVER_PROTOCOL": "HTTP/1.1",
    }
    body = b"".join(app(environ, lambda status, headers, exc=None: seen.update(status=status)))
    return seen["status"], body


def test_an_admin_css_file_is_served_with_debug_off_after_collectstatic(tmp_path):
    with override_settings(DEBUG=False, STATIC_ROOT=str(tmp_path)):
        app = WSGIHandler()  # middleware (WhiteNoise) built with these settings
        status, _ = get(app, "/static/admin/css/base.css")
        assert status.startswith("404")  # nothing collected yet: the test can fail
        call_command("collectstatic", "--noinput", verbosity=0)
        status, body = get(app, "/static/admin/css/base.css")
    assert status == "200 OK"
    assert b"body" in body
