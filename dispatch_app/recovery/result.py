"""What one recovery round reports: per candidate (``CandidateReport``) and in all (``RoundResult``).

Apart from ``round`` so that ``actions`` (which fills them in) and ``round`` do not import each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class CandidateReport:
    job_id: int
    status: str
    attempt: int
    age_seconds: float
    decision: str = ""  # a decide.KINDS value, or "" when skipped before deciding
    reason: str = ""
    outcome: str = ""  # done | would | locked | moved | deferred | error
    evidence: dict = field(default_factory=dict)


@dataclass
class RoundResult:
    domain: str
    ran: bool = True  # False: another session holds this domain's round lock
    dry_run: bool = False
    round_id: int | None = None
    scanned: int = 0
    redispatched: int = 0
    left_alone: int = 0
    unknown: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    has_more: bool = False
    oldest_candidate_age: float | None = None
    error: str = ""
    paced: str = ""  # the pacer's word on this round's cap (recovery.pacing); "" when not paced
    paced_out: bool = False  # not run: the pacer allowed no re-dispatch this round (ran is False too)
    candidates: list[CandidateReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error and self.errors == 0

    @property
    def status(self) -> str:
        if not self.ran:
            return "paced out" if self.paced_out else "busy"
        return "ok" if self.ok else "failed"

    def summary(self) -> dict:
        data = asdict(self)
        data["status"] = self.status
        return data
