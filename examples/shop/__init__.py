"""An example Django app on ProductFlow Dispatch: copy it, rename it, keep the shape.

- ``tasks.py``: ``django.tasks`` tasks (``@task``), enqueued in the caller's transaction.
- ``domains.py``: a payload domain of its own (a schema, ``work(ctx)``, a recovery policy).
- ``orders.py``: the code that enqueues both inside one ``transaction.atomic()``.
- ``examples/settings.py``: the settings a project adds (INSTALLED_APPS, TASKS, PRODUCTFLOW_DOMAINS).
"""
