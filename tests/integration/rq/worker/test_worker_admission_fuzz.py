"""Property: a fuzzed stream of RQ job hashes runs nothing, and the real job queued behind it still runs.

Hypothesis writes hashes built from RQ's own field names (and others) with generated values, some starting
from the hash the dispatcher writes and changing one field, straight into the delivery queue; a real
PipelineWorker in burst mode takes them with a real job sent by the dispatcher after them. Nothing named by a
hash is imported or called (the canary file stays absent), the worker does not crash, the real job succeeds.
"""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.models import Job
from dispatch_app.rq.worker import PipelineWorker
from tests.canary import CANARY_ENV
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import dispatch_now

pytestmark = pytest.mark.django_db(transaction=True)

RQ_FIELDS = [
    "data", "created_at", "origin", "description", "enqueued_at", "started_at", "ended_at", "timeout", "status",
    "result_ttl", "failure_ttl", "ttl", "meta", "success_callback_name", "failure_callback_name",
    "stopped_callback_name", "dependency_ids", "repeats_left", "repeat_intervals", "retries_left",
    "retry_intervals", "webhooks", "rate_limit_key", "rate_limit_concurrency", "group_id", "worker_name",
]  # fmt: skip
# The dispatcher's own call for an attempt PostgreSQL never gave: with the matching id and a readable hash it
# passes admission (whatever else the fuzzed fields say decides) and meets the start, which finds no such job.
OURS = "pf-999999999-1"
OUR_CALL = zlib.compress(json.dumps(["dispatch_app.run.delivery", None, [999999999, 1], {}]).encode())
CALLS = st.one_of(
    st.just(OUR_CALL),
    st.tuples(
        st.sampled_from(["tests.canary.touch", "os.system", "dispatch_app.run.delivery", "dispatch_app.run.agent"]),
        st.one_of(st.none(), st.just({})),
        st.lists(st.one_of(st.integers(-2, 2**64), st.booleans(), st.text(max_size=5)), max_size=3),
        st.one_of(st.just({}), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)),
    ).map(lambda call: zlib.compress(json.dumps(list(call)).encode())),
    st.binary(max_size=40),
    st.binary(max_size=40).map(zlib.compress),
)
VALUES = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([b"", b"0", b"-1", b"600", b"queued", b"started", b"delivery", b"tests.canary.touch", b"[1]"]),
    st.sampled_from([b'["pf-1-1"]', b'[{"url": "http://127.0.0.1:9/x"}]', b"2026-12-03T17:00:00.000000Z"]),
)
HASHES = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([OURS, OURS, "pf-01-1", "x"]), st.text("abc-19", min_size=1, max_size=8)),
        st.dictionaries(st.one_of(st.sampled_from(RQ_FIELDS), st.text(max_size=6)), VALUES, max_size=8),
        CALLS,
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    yield from provider_kit.installed(tmp_path_factory.mktemp("provider"))


# A worker run per example: 50 in CI, 1,000 with HYPOTHESIS_PROFILE=thorough.
@settings(max_examples=max(10, settings().max_examples // 3 if settings().max_examples < 1000 else 1000))
@given(hashes=HASHES)
def test_a_fuzzed_stream_of_job_hashes_runs_nothing_and_the_real_job_runs(
    provider, redis_conn, tmp_path_factory, hashes
):
    canary = tmp_path_factory.mktemp("canary") / "canary"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CANARY_ENV, str(canary))
        redis_conn.flushdb()
        queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
        for n, (job_id, fields, data) in enumerate(hashes):
            key = f"rq:job:{job_id}" if job_id == OURS else f"rq:job:fuzz{n}-{job_id}"
            mapping = {k.encode(errors="surrogatepass"): v for k, v in fields.items()}
            mapping.setdefault(b"data", data)
            if job_id == OURS:
                mapping.setdefault(b"origin", b"delivery")  # as the dispatcher writes it, unless fuzzed
            redis_conn.delete(key)
            redis_conn.hset(key, mapping=mapping)
            if key.removeprefix("rq:job:").encode() not in redis_conn.lrange(queue.key, 0, -1):
                redis_conn.rpush(queue.key, key.removeprefix("rq:job:"))
        real = submit("delivery", PAYLOADS["delivery"])
        dispatch_now()
        PipelineWorker([queue], connection=redis_conn, name="fuzz").work(burst=True)
    assert not canary.exists()
    assert Job.objects.get(pk=real.pk).status == "succeeded"
    assert redis_conn.llen(queue.key) == 0
