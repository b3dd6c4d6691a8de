"""``manage.py recover --once``: one recovery round per domain, then a dispatch drain.

In that order, so what recovery re-dispatches is on RQ when the command ends.
One domain's failure does not stop the others. Exit code: 0 every domain ran its
round and nothing failed; 1 any domain (or the drain) failed; 2 bad arguments or
settings; 3 nothing failed but a domain was busy (another process held its round
lock, so this command did not recover it).
"""

from __future__ import annotations

import argparse
import json
import logging

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.session_bounds import bound_sessions
from dispatch_app.domains import domain_keys
from dispatch_app.management.commands._args import SettingsErrorExit2
from dispatch_app.management.commands._deployment import require_own_redis
from dispatch_app.management.commands._migrated import require_migrated
from dispatch_app.runtime.default_logging import ensure_logging

EXIT_BUSY = 3


def domain_name(text: str) -> str:
    if text not in domain_keys():
        raise argparse.ArgumentTypeError(f"unknown domain {text!r}; valid domains: {', '.join(domain_keys())}")
    return text


class Command(SettingsErrorExit2, BaseCommand):
    help = "Run one recovery round per domain, then drain dispatch (recover --once)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", required=True, help="one round per domain, then exit")
        parser.add_argument(
            "--domain",
            action="append",
            type=domain_name,
            dest="domains",
            metavar="D",
            help=f"a domain to recover (repeatable; default all: {', '.join(domain_keys())})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print each candidate and the decision it would take; change nothing"
        )
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")

    def handle(self, *args, **options):
        from dispatch_app.domains.policy import resolve
        from dispatch_app.recovery.round import Round

        conf = dispatch_settings()
        domains = list(dict.fromkeys(options["domains"] or domain_keys()))
        policies = [resolve(domain, conf.RECOVERY) for domain in domains]
        dry_run = options["dry_run"]
        ensure_logging()
        bound_sessions()
        require_migrated()  # after the settings' own checks (exit code 2 needs no database)
        require_own_redis(register=not options["dry_run"])  # another live deployment here: refused, naming both

        results = []
        for policy in policies:
            try:
                results.append(Round(policy, dry_run=dry_run).run_once().summary())
            except Exception as exc:  # logged by the round with its domain; the next domain still runs
                results.append({"domain": policy.domain, "status": "failed", "error": f"{type(exc).__name__}: {exc}"})
                close_old_connections()

        drain = None if dry_run else self._drain(conf)
        failed = [r["domain"] for r in results if r["status"] == "failed"]
        if drain is not None and drain.get("error"):
            failed.append("dispatch")

        if options["json"]:
            self.stdout.write(json.dumps({"dry_run": dry_run, "domains": results, "dispatch": drain}, default=str))
        else:
            self._table(results, drain, dry_run)
        if failed:
            # Django turns this into exit status 1 on the command line.
            raise CommandError(f"recovery failed for: {', '.join(failed)}", returncode=1)
        busy = [r["domain"] for r in results if r["status"] == "busy"]
        if busy:
            # A cron job or script must not read "recovered" when another process still holds the domain.
            raise CommandError(
                f"not recovered, another process holds the round lock: {', '.join(busy)}", returncode=EXIT_BUSY
            )

    def _drain(self, conf) -> dict:
        from dispatch_app.dispatch.loop import DispatchLoop

        loop = DispatchLoop(conf)
        try:
            result = loop.run_once()
            return {"claimed": result.claimed, "dispatched": result.dispatched, "failed": result.failed}
        except Exception as exc:
            logging.getLogger("dispatch_app.recovery").exception(
                "dispatch drain after recovery failed", extra={"action": "recovery_error", "domain": "dispatch"}
            )
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            loop.close()

    def _table(self, results: list[dict], drain: dict | None, dry_run: bool) -> None:
        out = self.stdout
        if dry_run:
            for r in results:
                for c in r.get("candidates", []):
                    decision = c["decision"] or c["outcome"]
                    out.write(
                        f"{r['domain']:<13} job {c['job_id']:<8} {c['status']:<9} attempt {c['attempt']:<3} "
                        f"age {c['age_seconds']:>9.1f}s  {decision:<15} {c['reason']}"
                    )
        columns = ("status", "scanned", "redispatched", "left_alone", "unknown", "failed", "skipped", "errors")
        out.write(f"{'domain':<13} " + " ".join(f"{c:>12}" for c in columns) + f" {'has_more':>9} {'oldest_age_s':>12}")
        for r in results:
            age = r.get("oldest_candidate_age")
            cells = " ".join(f"{r.get(c, '-')!s:>12}" for c in columns)
            out.write(
                f"{r['domain']:<13} {cells} {r.get('has_more', '-')!s:>9} {'-' if age is None else f'{age:.1f}':>12}"
            )
            if r.get("error"):
                out.write(f"  {r['domain']}: {r['error']}")
        if drain is not None:
            if drain.get("error"):
                out.write(f"dispatch drain failed: {drain['error']}")
            else:
                out.write(f"dispatch drain: claimed {drain['claimed']}, dispatched {drain['dispatched']}")
