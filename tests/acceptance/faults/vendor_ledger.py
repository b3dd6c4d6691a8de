"""The vendor-call checks of the chaos scenarios: the ledger (VendorCall rows) against the local provider's call log.

Every call that reached the vendor was recorded first, and no call of a
non-retry-safe domain took effect twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

NOT_RETRY_SAFE = ("image_series", "partial_edit", "agent")


@dataclass
class VendorCalls:
    reached: list[tuple[str, str, str]]  # (operation, request id, outcome) of every recorded-kind call
    deliveries: int  # delivery's calls: retry-safe by contract, never recorded

    @property
    def failures(self) -> int:
        return sum(1 for _op, _request, outcome in self.reached if outcome == "failed")


def check(stack, call_log: Path) -> VendorCalls:
    ledger = {
        request_id: (job_id, seq, domain)
        for request_id, job_id, seq, domain in stack.sql(
            "SELECT v.request_id, v.job_id, v.seq, j.domain FROM dispatch_app_vendorcall v "
            "JOIN dispatch_app_job j ON j.id = v.job_id"
        )
    }
    lines = [line.split() for line in call_log.read_text().splitlines()] if call_log.exists() else []
    # delivery's calls carry no request id ("-"): retry-safe by contract, so the ledger does not record them.
    deliveries = [line for line in lines if line[0] == "deliver" and line[1] == "-"]
    reached = [(op, request_id, outcome) for op, request_id, outcome, _pid in lines if request_id != "-"]
    assert deliveries and len(deliveries) + len(reached) == len(lines), "only delivery calls go unrecorded"
    unrecorded = [r for r in reached if r[1] not in ledger]
    assert not unrecorded, f"vendor calls made without a ledger record: {unrecorded[:5]}"
    took_effect = Counter(ledger[request_id] for _op, request_id, outcome in reached if outcome == "succeeded")
    repeated = {key: n for key, n in took_effect.items() if n > 1 and key[2] in NOT_RETRY_SAFE}
    assert not repeated, f"non-retry-safe vendor calls that took effect more than once: {repeated}"
    return VendorCalls(reached=reached, deliveries=len(deliveries))


def bounded_unknowns(stack) -> list[tuple[str, str]]:
    """Every outcome_unknown is a documented bounded state: a call the vendor cannot be asked about, or past
    the trust bound."""
    unknown = stack.sql("SELECT domain, error FROM dispatch_app_job WHERE status = 'outcome_unknown'")
    for domain, error in unknown:
        assert "cannot be asked" in error or "trust bound" in error, (domain, error)
    return unknown
