"""Per-domain recovery of unfinished jobs (docs/architecture.md, "Components", 9).

One module per role: ``discovery`` (the SQL), ``evidence`` (what RQ, the worker registry and the vendor say:
RQ's side read through ``rq.state.evidence``), ``decide`` (a pure function), ``pacing`` (how much a round may
send beside new work), ``round`` (one round, recorded through the store) and ``loop`` (the per-domain loop the
supervisor runs on its own thread). A domain's recovery policy is the domain's: ``domains.policy``.
"""
