"""The database clock. Every timestamp, lease and threshold uses it, never the host's."""

from django.db import connection
from django.db.models import DateTimeField, Func


class ClockTimestamp(Func):
    """``clock_timestamp()``: the server's wall clock at the statement, not the transaction start."""

    template = "clock_timestamp()"
    output_field = DateTimeField()

    def __init__(self):
        super().__init__()


def db_now(using_connection=None):
    with (using_connection or connection).cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]
