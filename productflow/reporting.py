"""Error reports that never show credentials: ``DEFAULT_EXCEPTION_REPORTER_FILTER``.

Django's filter hides settings whose *name* looks secret (``PASSWORD``, ``SECRET_KEY``),
but this project configures its servers by URL: ``DATABASE_URL``, ``REDIS_URL``,
``REDIS_URL_<QUEUE>`` and every ``RQ_QUEUES[...]['URL']`` carry their passwords in the
value, and so do the local variables of a frame that connects and, under the development
server, the request's ``META`` (the process environment). With ``DEBUG`` on, the 500 page
and the error e-mail showed them all. This filter also masks the password of every URL
(``scheme://user:password@host``) and every ``password=`` query parameter, wherever a string
is shown, and keeps the rest of the URL (which server it was is worth seeing).
"""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

MASK = "********"
# scheme://user:password@ or scheme://:password@ (the password up to the last @ before the host).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^\s]*(?=@)")
_QUERY_PASSWORD = re.compile(r"(?i)(?P<head>[?&;](?:password|passwd|pass|pwd)=)[^&;\s]*")


def mask_credentials(text: str) -> str:
    """``text`` with every URL password and ``password=`` query value replaced by ``MASK``."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + MASK, text)


class CredentialsFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key, value):
        return self._masked(super().cleanse_setting(key, value))

    def get_safe_request_meta(self, request):
        return {k: self._masked(v) for k, v in super().get_safe_request_meta(request).items()}

    def get_traceback_frame_variables(self, request, tb_frame):
        return [(name, self._masked(value)) for name, value in super().get_traceback_frame_variables(request, tb_frame)]

    def _masked(self, value: Any) -> Any:
        if isinstance(value, str):
            return mask_credentials(value)
        if isinstance(value, dict):
            return {k: self._masked(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._masked(v) for v in value)
        # Anything else is shown by its repr: a connection pool, a parsed URL, a settings object.
        text = repr(value)
        masked = mask_credentials(text)
        return value if masked == text else masked
