"""The store: every write to a job's rows -- the job, its envelopes, its attempts, its events, its vendor calls.

The engines (dispatcher, worker, recovery), the operator's actions and the ``django.tasks`` backend call these
functions and hold no SQL write of their own on those tables (``tests/unit/test_store_owns_writes.py`` reads the
source and fails naming any that appears elsewhere). Each move is a compare-and-set in its WHERE clause.

- ``transitions``: the job's state machine, one statement per move (its diagram is there).
- ``jobs``: the job's creation with its first envelope (the outbox write), and the writes beside its status.
- ``envelopes``: the one envelope builder (a new envelope's columns, shared by submit, re-dispatch and re-arm)
  and the operator's envelope moves.
- ``claim``: the dispatcher's envelope statements (claim, mark, fail, release).
- ``events``: a job's history rows (``JobEvent``).
- ``history_triggers``: the attempt history (``JobAttempt``), written by PostgreSQL triggers.
- ``notify_triggers``: the envelope triggers that wake the dispatchers (NOTIFY, delivered on commit).
- ``trigger_sql``: how those triggers are installed (django-pgtrigger's SQL without its per-call ignore check).
- ``vendor_calls``: the vendor-call ledger.
- ``retention``: pruning what no one reads any more.
- ``tables``: the table names, from the models.

Nothing is imported here, so ``models`` can load ``store.history_triggers`` (a leaf) without the rest.
"""
