from django.apps import AppConfig
from django.core import checks


class DispatchAppConfig(AppConfig):
    name = "dispatch_app"
    verbose_name = "ProductFlow dispatch"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(_check_dispatch_settings)


def _check_dispatch_settings(app_configs, **kwargs):
    from django.core.exceptions import ImproperlyConfigured

    from dispatch_app.conf import dispatch_settings

    try:
        dispatch_settings()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="dispatch_app.E001")]
    return []
