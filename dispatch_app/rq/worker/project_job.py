"""ProjectJob: the job class RQ's own code uses inside a PipelineWorker, for hashes anyone may have written.

The take is guarded by ``admission``, but RQ's maintenance (``clean_registries``: the started
registry's abandoned jobs, the intermediate list's stuck jobs) reads job hashes too, with RQ's
plain ``Job``: a forged hash with a timeout of ``never`` raised out of ``Job.restore`` and ended
the worker, and an abandoned "started" hash had its failure callback imported and called by name.

Here a hash RQ cannot read (or a key that holds no hash), or an id no RQ job can have, is a job that does not exist
(``NoSuchJobError``, which every RQ caller already handles: the id leaves the list that named it),
no callback path held in Redis is ever imported and no webhook it names is ever called (an
abandoned job's failure sends them): the publisher never writes either and admission refuses a job
that carries one, so in a hash they can only be forged.
"""

from __future__ import annotations

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

import dispatch_app.rq.worker.admission as admission


class ProjectJob(Job):
    @classmethod
    def fetch(cls, id: str, connection=None, serializer=None) -> Job:
        # RQ's Job(id) raises ValueError on an id outside RQ's alphabet: such an id names no job.
        if not isinstance(id, str) or not id.isascii() or admission.malformed_id(id.encode()):
            raise NoSuchJobError(f"No such job: {str(id)[:100]!r} is not an RQ job id")
        return super().fetch(id, connection=connection, serializer=serializer)

    def refresh(self):
        try:
            data = self.connection.hgetall(self.key)
        except redis.ResponseError as exc:  # WRONGTYPE: its key holds no hash (junk anyone may write)
            raise NoSuchJobError(f"No such job: {self.key} holds no hash") from exc
        if not data:
            raise NoSuchJobError(f"No such job: {self.key}")
        unreadable = admission.restore(self, data)
        if unreadable is not None:
            raise NoSuchJobError(f"{self.key}: {unreadable}")

    # Read-only: RQ's Job.__init__ assigns the private slots (_success_callback, ...), never these names.
    @property
    def success_callback(self):
        return None

    @property
    def failure_callback(self):
        return None

    @property
    def stopped_callback(self):
        return None

    def send_webhooks(self, status, *, exc_string=None) -> None:
        return None
