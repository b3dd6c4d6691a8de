"""Our triggers' installation SQL: django-pgtrigger's, without the ignore check it puts in front of every call.

django-pgtrigger wraps each trigger function in ``IF _pgtrigger_should_ignore(TG_NAME) ...``: a second PL/pgSQL
call with an exception block (a subtransaction) on every row a row trigger fires for -- 8 to 9 calls per job,
about as much as the triggers' own work (docs/benchmarks.md, "PostgreSQL's work per job"). Nothing ignores our
triggers: they keep the attempt history, the job's age and the dispatcher's wake-ups true for every writer, so
``pgtrigger.ignore()`` is not supported on them (it has no effect). A test or an operator who needs a job to look
older sets ``updated_at`` in the UPDATE itself: the ``updated_at`` trigger only stamps rows whose statement left
the column as it was (models.Job).

The template is django-pgtrigger 4.x's ``UpsertTriggerSql`` v1 minus the ignore function and its call; the hash
written in the trigger's comment is computed from it, so ``manage.py pgtrigger ls`` still tells installed from
outdated. Migrations name this class (``deconstruct`` gives its path), so its template must not change once
released: a change means a new class.
"""

from __future__ import annotations

import pgtrigger
from pgtrigger import compiler


class UnignoredTriggerSql(compiler.UpsertTriggerSql):
    """``UpsertTriggerSql`` for a trigger function with no ignore check (version 1: never edit the template)."""

    def get_template(self) -> str:
        return """
            CREATE OR REPLACE FUNCTION {pgid}()
            RETURNS TRIGGER AS $$
                {declare}
                BEGIN
                    {func}
                END;
            $$ LANGUAGE plpgsql;

            DROP TRIGGER IF EXISTS {pgid} ON {table};
            CREATE {constraint} TRIGGER {pgid}
                {when} {operation} ON {table}
                {timing}
                {referencing}
                FOR EACH {level} {condition}
                EXECUTE PROCEDURE {execute};

            COMMENT ON TRIGGER {pgid} ON {table} IS '{hash}';
        """


class Trigger(pgtrigger.Trigger):
    """A ``pgtrigger.Trigger`` installed with ``UnignoredTriggerSql``."""

    def compile(self, model) -> compiler.Trigger:
        compiled = super().compile(model)
        kwargs = {key: value for key, value in compiled.sql.kwargs.items() if key != "ignore_func_name"}
        return compiler.Trigger(name=self.name, sql=UnignoredTriggerSql(**kwargs))
