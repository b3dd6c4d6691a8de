"""The admin's own pages (a job's or an envelope's change page, History) print instants as the operator
pages do (``dispatch_ops.utc``): "2026-12-01 10:26:05 UTC", not the locale's "Dec. 1, 2026, 10:26 a.m."

Output formats only; what the admin's date inputs accept is left to Django's defaults.
"""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
