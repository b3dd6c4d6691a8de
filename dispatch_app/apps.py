from django.apps import AppConfig
from django.core import checks


class DispatchAppConfig(AppConfig):
    name = "dispatch_app"
    verbose_name = "ProductFlow dispatch"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        import dispatch_app.config.settings as conf
        import dispatch_app.domains.registry as registry
        import dispatch_app.outbox.submit as outbox
        import dispatch_app.rq.checks  # noqa: F401 - registers its checks: django-rq unmounted, apps' order
        import dispatch_app.rq.servers as redis_servers
        import dispatch_app.tasks.run as tasks_run
        from dispatch_app.config.rules import TAG, check_settings_rules
        from dispatch_app.dispatch.writer_send import WriterSend
        from dispatch_app.domains.policy import validate_overrides
        from dispatch_app.execution import execute
        from dispatch_app.tasks.queues import task_domains

        redis_servers.ensure_redis_url()
        # What the lower layers may not import is handed to them here (tests/unit/test_import_layers.py):
        # DISPATCH['RECOVERY'] names domains, and the django.tasks queues are domains too.
        conf.register_validator("RECOVERY", validate_overrides)
        registry.add_source("dispatch_app.tasks.queues.task_domains()", task_domains)
        # Each declared queue gets its RQ_QUEUES entry (and its lanes theirs) whenever the domains are loaded.
        registry.on_loaded(redis_servers.add_queue_entries)
        checks.register(_check_dispatch_settings)
        checks.register(check_settings_rules, TAG)  # rules between settings (README, "Settings")
        setting_changed.connect(_domains_setting_changed, dispatch_uid="dispatch_app.domains")
        # The task entry points run jobs through the execution engine, which the tasks engine does not import.
        tasks_run.install_execute(execute)
        # The writer's own send (DISPATCH['SUBMIT_SENDS']; off, it sends nothing and reads the setting per submit).
        outbox.install_writer_send(WriterSend())
        # Declared domains load now, so every queue has its RQ_QUEUES entry before anything reads it.
        registry.all_domains()


def _domains_setting_changed(setting, **kwargs):
    if setting in ("PRODUCTFLOW_DOMAINS", "TASKS"):
        import dispatch_app.domains.registry as registry
        import dispatch_app.rq.checks  # noqa: F401 - registers its checks: django-rq unmounted, apps' order

        registry.reset()


def _check_dispatch_settings(app_configs, **kwargs):
    from django.core.exceptions import ImproperlyConfigured

    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.rq.deployment import validate_setting

    errors = []
    try:
        dispatch_settings()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="dispatch_app.E001"))
    namespace = validate_setting()
    if namespace:
        errors.append(checks.Error(namespace, id="dispatch_app.E030"))
    return errors
