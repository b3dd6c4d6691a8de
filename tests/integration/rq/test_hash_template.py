"""The send writes each job hash from a per-domain template: field for field what RQ's own Job would write.

The template saves building an RQ ``Job`` per envelope; these tests hold it to
RQ's own code (``create_job``, ``_prepare_for_queue``, ``to_dict``) for every
registered domain, so an RQ upgrade that adds or renames a field fails here
instead of writing hashes RQ's worker reads differently.
"""

import re
from datetime import UTC, datetime

import pytest
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from dispatch_app.domains import all_domains
from dispatch_app.rq.ids import SIGNATURE_FIELD, signature
from dispatch_app.rq.publish import HashTemplate, Publisher, _hset_args, rq_job_id
from dispatch_app.store.claim import Claimed
from tests.integration.loop_kit import loop_settings

CLOCKS = ("created_at", "enqueued_at")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _envelope(domain, job_id: int, attempt: int) -> Claimed:
    return Claimed(job_id, job_id, attempt, domain.key, domain.queue, 0, attempt == 1)


def _without_clocks(fields: list) -> list:
    pairs = list(zip(fields[::2], fields[1::2], strict=True))
    return [(name, value) for name, value in pairs if name not in CLOCKS]


def test_the_template_writes_what_rqs_own_job_writes_for_every_domain(redis_conn):
    publisher = Publisher(loop_settings(), connection=redis_conn)
    for domain in all_domains():
        queue = publisher.queue(domain.queue)
        for job_id, attempt in ((7, 1), (123_456_789, 3), (42, 12)):
            envelope = _envelope(domain, job_id, attempt)
            rq_id = rq_job_id(job_id, attempt)
            ours = publisher.template(queue, envelope).fields_for(envelope, rq_id)
            rqs = _hset_args(publisher._job(queue, envelope, rq_id))
            # Ours leads with the dispatcher's signature (rq_ids), which RQ's Job does not know; then RQ's fields.
            assert ours[:2] == [SIGNATURE_FIELD, signature(rq_id, domain.task_path, domain.queue)]
            ours = ours[2:]
            assert _without_clocks(ours) == _without_clocks(rqs), domain.key
            assert ours[::2] == rqs[::2], "the fields or their order differ"
            clocks = dict(zip(ours[::2], ours[1::2], strict=True))
            assert all(ISO.match(clocks[name]) for name in CLOCKS), clocks


def test_a_sent_job_reads_back_as_rq_sees_it(redis_conn):
    """Through RQ's own Job.fetch: the function, its arguments, the timeout and the clocks of this send."""
    conf = loop_settings()
    publisher = Publisher(conf, connection=redis_conn)
    domain = all_domains()[0]
    envelope = _envelope(domain, 991, 2)
    before = datetime.now(UTC)
    assert publisher.send([envelope]).sent == 1

    job = RQJob.fetch(rq_job_id(991, 2), connection=redis_conn, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.kwargs) == (domain.task_path, [991, 2], {})
    described = f"{domain.key} job 991 attempt 2"
    assert (job.origin, job.timeout, job.description) == (domain.queue, conf.RQ_JOB_TIMEOUT, described)
    assert job.get_status() == "queued"
    assert before <= job.enqueued_at <= datetime.now(UTC)
    assert redis_conn.lrange(f"rq:queue:{domain.queue}", 0, -1) == [rq_job_id(991, 2).encode()]


def test_an_rq_without_a_templated_field_is_refused_not_written_stale(redis_conn):
    publisher = Publisher(loop_settings(), connection=redis_conn)
    domain = all_domains()[0]
    job = publisher._job(publisher.queue(domain.queue), _envelope(domain, 1, 1), "pf-template")
    job.description = None  # to_dict then has no description field, as an RQ that renamed it would
    with pytest.raises(RuntimeError, match="no description field"):
        HashTemplate(job)
