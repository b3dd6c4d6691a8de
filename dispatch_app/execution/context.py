"""What a domain's ``work`` is given: the job, its payload, the provider, and the vendor-call ledger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

import dispatch_app.store.api as store
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.domains.providers import Provider


@dataclass
class WorkContext:
    job_id: int
    attempt: int
    payload: dict
    provider: Provider
    # The start's database time (START_SQL returns it): dispatch_app.tasks hands it to task_started.
    started_at: Any = None
    # The domain (or task queue) key: its policy tells the ledger what to do about a call left in doubt.
    domain: str = ""

    def record_vendor_request(self, request_id: str) -> None:
        """Committed before the vendor call, so recovery can ask the vendor what happened."""
        with connection.cursor() as cursor:
            store.record_vendor_request(cursor, self.job_id, self.attempt, request_id)

    def call_vendor(self, purpose: str, call, *, verifiable: bool):
        """Make one vendor call through the ledger (``dispatch_app.store.vendor_calls``): ``call(request_id)``.

        Recorded (committed) before it is made and settled after; in a retry, a
        call that already took effect returns its recorded result instead of
        being made again. ``verifiable``: the vendor keeps a record of the
        request id that ``Provider.request_status`` can ask about.
        """
        from dispatch_app.domains.policy import resolve
        from dispatch_app.execution.ledger import Ledger

        ledger = getattr(self, "_ledger", None)
        if ledger is None:
            policy = resolve(self.domain, dispatch_settings().RECOVERY) if self.domain else None
            ledger = self._ledger = Ledger(self.job_id, self.attempt, self.provider, policy=policy)
        return ledger.call(purpose, call, verifiable=verifiable)

    def outcome_riding(self):
        """(call id, result) of the last call, which succeeded and whose outcome nothing has written yet; or None.
        The worker's finish of work that succeeded writes it (store.transitions.finish)."""
        ledger = getattr(self, "_ledger", None)
        return ledger.outcome_riding() if ledger is not None else None

    def write_outcome(self, *, quiet: bool = False) -> None:
        """The last succeeded call's outcome, which the ledger writes with its next record (none came)."""
        ledger = getattr(self, "_ledger", None)
        if ledger is not None:
            ledger.write_outcome(quiet=quiet)
