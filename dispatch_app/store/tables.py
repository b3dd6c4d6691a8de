"""The tables of a job's rows, named from the models (one place, not a literal per module)."""

from __future__ import annotations

from dispatch_app.models import DispatchEnvelope, DomainPause, Job, JobAttempt, JobEvent, VendorCall

JOB = Job._meta.db_table
ENVELOPE = DispatchEnvelope._meta.db_table
ATTEMPT = JobAttempt._meta.db_table
EVENT = JobEvent._meta.db_table
VENDOR_CALL = VendorCall._meta.db_table
PAUSE = DomainPause._meta.db_table
