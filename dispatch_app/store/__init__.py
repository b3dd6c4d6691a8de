"""The store: every write to every table of the app, behind one front door (``store.api``).

Engines, operator actions, housekeeping and the ``django.tasks`` backend import ``dispatch_app.store.api`` and call
its named operations; they hold no SQL or ORM write of their own (``tests/unit/test_store_owns_writes.py`` reads the
source and fails naming any that appears elsewhere, and ``tests/unit/test_import_layers.py`` any import past the
door). Each move of a job is a compare-and-set in its WHERE clause.

- ``transitions``: the job's state machine, one statement per move (its diagram is there).
- ``jobs``: the job's creation with its first envelope (the outbox write), and the writes beside its status.
- ``envelope_builder``, ``envelopes``: a new envelope's columns, and the operator's envelope moves.
- ``claim``: the dispatcher's envelope statements (claim, mark, fail, release); ``batch_redispatch``: a recovery
  round's re-dispatches; ``writer_lease``: an envelope its writer sends.
- ``events``: a job's history rows; ``vendor_calls``: the vendor-call ledger.
- ``arms``, ``pauses``, ``heartbeats``, ``recovery_rounds``: a dispatcher's arm, an operator's pause, the processes'
  heartbeats, recovery's rounds; ``retention``: pruning.
- ``tables``: the table names, from the models (a read may import them); ``triggers/``: the schema's trigger SQL
  (the attempt history, the NOTIFY) and the migrations' bounded locks, a leaf the models import.

Nothing is imported here, so ``models`` can load ``store.triggers`` without the rest.
"""
