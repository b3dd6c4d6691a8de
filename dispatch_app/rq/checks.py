"""System checks that keep django-rq's pickle-reading side doors shut: its views in a URLconf, its worker commands.

Registered when imported (``DispatchAppConfig.ready`` imports this module).

- ``dispatch_app.E020``: the project's URLconf mounts a django-rq view (``include("django_rq.urls")``, django-rq's
  admin ``Dashboard`` registered again, a single view in a ``path``). Some of those views read RQ job hashes with
  pickle whatever ``RQ_QUEUES`` says, so anyone who can write to Redis runs code in the web process.
- ``dispatch_app.E021``: ``django_rq`` is listed before ``dispatch_app`` in ``INSTALLED_APPS``. Django takes a
  management command from the first app that has it, so ``manage.py rqworker`` would be django-rq's own, which
  unpickles job hashes and runs whatever function a hash names, instead of the project's refusal naming
  ``runworkers``. (django-rq's commands run the system checks first, so this error stops them as well.)
"""

from __future__ import annotations

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.urls import URLPattern, URLResolver, get_resolver

RQ_PACKAGE = "django_rq"
PROJECT_APP = "dispatch_app"


def _is_rq(module: str | None) -> bool:
    return bool(module) and (module == RQ_PACKAGE or module.startswith(RQ_PACKAGE + "."))


def _view_module(callback) -> str | None:
    """The module a view was written in, through the wrappers around it (admin_view, functools.wraps)."""
    seen = 0
    while callback is not None and seen < 20:  # a bound on a wrapper chain, which could loop
        view_class = getattr(callback, "view_class", None)
        if view_class is not None:
            return view_class.__module__
        if _is_rq(getattr(callback, "__module__", None)):
            return callback.__module__
        callback = getattr(callback, "__wrapped__", None)
        seen += 1
    return None


def rq_mounts(resolver: URLResolver, prefix: str = "") -> dict[str, list[str]]:
    """{where the views are included: [full path of each django-rq view there]} over the whole URLconf."""
    found: dict[str, list[str]] = {}
    for entry in resolver.url_patterns:
        path = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            conf = entry.urlconf_name
            name = conf if isinstance(conf, str) else getattr(conf, "__name__", "")
            if _is_rq(name):
                found.setdefault(path, []).append(f"{path} (include({name!r}))")
                continue
            for where, paths in rq_mounts(entry, path).items():
                found.setdefault(where, []).extend(paths)
        elif isinstance(entry, URLPattern) and _is_rq(_view_module(entry.callback)):
            found.setdefault(prefix, []).append(path)
    return found


@checks.register(checks.Tags.urls)
def check_rq_views_unmounted(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if getattr(settings, "ROOT_URLCONF", None) is None:
        return []
    errors = []
    for where, paths in sorted(rq_mounts(get_resolver()).items()):
        shown = ", ".join(repr(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        errors.append(
            checks.Error(
                f"The URLconf mounts {len(paths)} django-rq view(s) at {where or '/'!r}: {shown}. Some django-rq "
                "views read RQ job hashes with pickle (RQ's default serializer) whatever RQ_QUEUES says, so anyone "
                "who can write to Redis runs code in the web process.",
                hint="Remove them from the URLconf (and do not register django_rq.models.Dashboard in an admin "
                "site): the dispatch dashboard (/admin/dispatch_app/job/dashboard/) shows the queues and workers.",
                id="dispatch_app.E020",
            )
        )
    return errors


@checks.register()
def check_app_order(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    names = [config.name for config in apps.get_app_configs()]
    if RQ_PACKAGE not in names or PROJECT_APP not in names or names.index(PROJECT_APP) < names.index(RQ_PACKAGE):
        return []
    return [
        checks.Error(
            f"{RQ_PACKAGE!r} is listed before {PROJECT_APP!r} in INSTALLED_APPS. Django takes a management command "
            f"from the first app that has it, so 'manage.py rqworker' and 'rqworker-pool' would be django-rq's own, "
            "which unpickle job hashes and run whatever function a hash in the project's queues names.",
            hint=f"List {PROJECT_APP!r} before {RQ_PACKAGE!r}: its rqworker refuses the project's queues and names "
            "'manage.py runworkers', the project's worker.",
            id="dispatch_app.E021",
        )
    ]
