"""One attempt's walk through its vendor calls (``WorkContext.call_vendor``), over the rows of store.vendor_calls.

A ``ProviderError`` says the *failing* call took no effect; the calls before it
in the same attempt did. So a retry must not start the work from the top: it
walks the same calls in the same order (``seq``, the call's position in the
domain's work) and, per call, reads the ledger first:

- ``succeeded``: the call took effect; its recorded result is returned and the
  vendor is not called again;
- ``failed``: it took no effect; it is made again (a new request id);
- ``pending``/``unknown``: in doubt (the worker died mid-call, or the call timed
  out). The domain's policy decides (``RecoveryPolicy.in_doubt``): a retry-safe
  domain makes the call again; a vendor that keeps request records
  (``verifiable``) is asked, and its answer settles the call; otherwise the work
  stops with ``VendorCallInDoubt`` and recovery decides (``recovery.decide``),
  within the domain's ``VENDOR_EVIDENCE_TRUST_SECONDS``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from dispatch_app.domains.base import CONCLUDE, RERUN, RecoveryPolicy
from dispatch_app.domains.providers import ProviderError, ProviderTimeout, call_with_timeout
from dispatch_app.store.api import (
    FAILED,
    SUCCEEDED,
    UNKNOWN,
    UNSETTLED,
    AttemptSuperseded,
    Call,
    VendorCallInDoubt,
    confirmed_result,
    latest_calls,
    settle,
)
from dispatch_app.store.api import record_vendor_call as record

log = logging.getLogger("dispatch_app.vendor_calls")  # the ledger's log lines keep their logger


class Ledger:
    """One attempt's walk through its calls (``WorkContext.call_vendor``)."""

    # Without a domain's policy, a call's own ``verifiable`` decides: asked if it is, outcome_unknown if not.
    ASK_WHEN_VERIFIABLE = RecoveryPolicy(uses_vendor_request_id=True)

    def __init__(self, job_id: int, attempt: int, provider, policy: RecoveryPolicy | None = None):
        self.job_id = job_id
        self.attempt = attempt
        self.provider = provider
        self.policy = policy if policy is not None else self.ASK_WHEN_VERIFIABLE
        self.next_seq = 0
        # A first attempt has nothing to resume (no attempt before it recorded anything): no query.
        self._prior: dict[int, Call] | None = {} if attempt == 1 else None
        # (call id, result) of a call that succeeded and whose outcome rides with the attempt's next
        # write: the next call's record, the job's finish (outcome_riding), or ``write_outcome``.
        self._unwritten: tuple[int, Any] | None = None

    def _earlier(self, seq: int) -> Call | None:
        if self._prior is None:
            self._prior = latest_calls(self.job_id)  # one query, before the attempt's first call
        return self._prior.get(seq)

    def _timeout(self) -> float:
        timeout = float(getattr(self.provider, "timeout", 30.0))
        # The provider raises ProviderTimeout itself at `timeout`; this guard only catches one that does not.
        return timeout + max(1.0, timeout * 0.1)

    def write_outcome(self, *, quiet: bool = False) -> None:
        """Write the outcome still riding (a succeeded call's), on its own: the work ended or broke.

        ``quiet``: on the way out of an exception, a database error is logged, not raised over it;
        the call then reads "pending" (in doubt), as if the worker had died right after it.
        """
        if self._unwritten is None:
            return
        call_id, result = self._unwritten
        self._unwritten = None
        try:
            settle(call_id, SUCCEEDED, result=result)
        except DatabaseError as exc:
            if not quiet:
                raise
            log.warning(
                "job %s: the outcome of vendor call %s (succeeded) could not be saved: %s",
                self.job_id,
                call_id,
                exc,
                extra={"action": "vendor_outcome_unsaved", "domain": "worker"},
            )

    def outcome_riding(self) -> tuple[int, Any] | None:
        """The last succeeded call's (id, result), handed to the job's finish to write (store.transitions.finish)."""
        riding, self._unwritten = self._unwritten, None
        return riding

    def call(self, purpose: str, fn: Callable[[str], Any], *, verifiable: bool) -> Any:
        try:
            return self._call(purpose, fn, verifiable)
        except BaseException:
            self.write_outcome(quiet=True)
            raise

    def _call(self, purpose: str, fn: Callable[[str], Any], verifiable: bool) -> Any:
        seq = self.next_seq
        self.next_seq += 1
        earlier = self._earlier(seq)
        if earlier is not None:
            if earlier.purpose != purpose[:200]:
                raise RuntimeError(
                    f"job {self.job_id}: vendor call {seq} was {earlier.purpose!r} in attempt {earlier.attempt}, "
                    f"now {purpose!r}; the work must make its calls in the same order every attempt"
                )
            if earlier.status == SUCCEEDED:
                # Settled by recovery on the vendor's word: the vendor's answer is all there is.
                return earlier.result if earlier.result is not None else confirmed_result(earlier)
            if earlier.status in UNSETTLED:
                resumed = self._settle_earlier(earlier, verifiable)
                if resumed is not None:
                    return resumed
        request_id = self.provider.new_request_id()
        riding, self._unwritten = self._unwritten, None
        try:
            call_id = record(self.job_id, self.attempt, seq, purpose, request_id, settled=riding)
        except AttemptSuperseded:
            raise  # the statement ran: the outcome it carried is written
        except BaseException:
            self._unwritten = riding  # not written: call() writes it on the way out
            raise
        try:
            result = call_with_timeout(lambda: fn(request_id), self._timeout(), f"{purpose} ({request_id})")
        except VendorCallInDoubt:
            raise
        except ProviderError as exc:
            settle(call_id, FAILED, error=f"{type(exc).__name__}: {exc}")
            raise
        except ProviderTimeout as exc:
            settle(call_id, UNKNOWN, error=f"{type(exc).__name__}: {exc}")
            call = Call(call_id, self.attempt, seq, purpose, request_id, UNKNOWN, None, 0.0)
            raise VendorCallInDoubt(call, f"gave no answer: {exc}") from exc
        except BaseException as exc:
            # Whatever broke, the vendor may have acted: in doubt, never "failed".
            settle(call_id, UNKNOWN, error=f"{type(exc).__name__}: {exc}")
            raise
        self._unwritten = (call_id, result)
        return result

    def _settle_earlier(self, earlier: Call, verifiable: bool) -> Any | None:
        """An earlier call in doubt, as the policy says: its result if it took effect, None to call again."""
        action = self.policy.in_doubt(askable=verifiable and bool(earlier.request_id))
        if action == RERUN:
            # Kept in doubt (it may have taken effect), but closed: the newest call at this position is the new one.
            settle(earlier.id, UNKNOWN, error="in doubt when its attempt ended; made again (retry-safe)")
            log.info(
                "job %s: vendor call %s (%s) was in doubt when its attempt ended; making it again (retry-safe)",
                self.job_id,
                earlier.seq,
                earlier.request_id or "-",
                extra={"action": "vendor_call_rerun", "domain": "worker"},
            )
            return None
        if action == CONCLUDE:
            raise VendorCallInDoubt(earlier, "was in flight when its attempt ended; this vendor cannot be asked")
        try:
            answer = call_with_timeout(
                lambda: self.provider.request_status(earlier.request_id),
                self._timeout(),
                f"status of {earlier.request_id}",
            )
        except Exception as exc:  # the vendor being unreachable leaves the call in doubt
            raise VendorCallInDoubt(earlier, f"in doubt, vendor status unavailable ({type(exc).__name__}: {exc})")
        if answer == SUCCEEDED:
            result = confirmed_result(earlier)
            settle(earlier.id, SUCCEEDED, result=result, error="confirmed by the vendor on resume")
            return result
        if answer in (FAILED, "unknown"):
            said = "failed" if answer == FAILED else "never reached the vendor"
            settle(earlier.id, FAILED, error=f"vendor says it {said} (asked on resume)")
            log.info(
                "job %s: vendor call %s (%s) %s; making it again",
                self.job_id,
                earlier.seq,
                earlier.request_id,
                said,
                extra={"action": "vendor_call_resume", "domain": "worker"},
            )
            return None
        raise VendorCallInDoubt(earlier, f"in doubt, vendor says {answer!r}")
