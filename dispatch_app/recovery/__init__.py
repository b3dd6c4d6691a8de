"""Per-domain recovery of unfinished jobs (DESIGN.md §9).

One module per role: ``policy`` (per-domain settings), ``discovery`` (the SQL),
``evidence`` (what RQ, the worker registry and the vendor say), ``decide`` (a
pure function), ``round`` (one round, recorded) and ``loop`` (the per-domain
loop the supervisor runs on its own thread).

``dispatch_app.conf`` imports ``policy`` (which imports neither conf nor the rest).
"""
