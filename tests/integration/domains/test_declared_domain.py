"""A domain the project declares (tests/project/domains.py) goes the whole way: submitted, dispatched through
the outbox to its own queue, run by a real RQ worker, and recovered by recovery under its own policy."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.domains import DEFAULT_DOMAINS, registry
from dispatch_app.models import DispatchEnvelope, Job, JobEvent
from dispatch_app.recovery.round import Round
from tests.integration import provider_kit
from tests.integration.recovery_helpers import dispatch_now, policy, run_workers, start_like_a_worker
from tests.project import domains as project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


@pytest.fixture
def declared(settings):
    settings.RQ_QUEUES = {name: dict(entry) for name, entry in settings.RQ_QUEUES.items()}
    settings.PRODUCTFLOW_DOMAINS = [*DEFAULT_DOMAINS, "tests.project.domains", "tests.project.domains.CAPTIONS"]
    project.RAN.clear()
    yield
    registry.reset()


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def test_a_declared_domain_is_submitted_dispatched_to_its_queue_and_run_by_a_worker(declared, redis_conn):
    thumb = submit("thumbnail", {"image": "shoe.png", "width": 256})
    caption = submit("caption", {"subject": "a red shoe"})
    assert DispatchEnvelope.objects.get(job=thumb).queue == "media"

    dispatch_now()
    assert Queue("media", connection=redis_conn, serializer=JSONSerializer).count == 2
    assert set(Job.objects.filter(pk__in=[thumb.pk, caption.pk]).values_list("status", flat=True)) == {"queued"}

    run_workers(redis_conn)

    thumb.refresh_from_db()
    caption.refresh_from_db()
    assert (thumb.status, thumb.result) == ("succeeded", {"thumbnail": "shoe.png@256w"})
    assert (caption.status, caption.result) == ("succeeded", {"caption": "a photo of a red shoe"})
    assert sorted(project.RAN) == sorted([("thumbnail", thumb.pk, 1), ("caption", caption.pk, 1)])


def test_a_declared_domain_validates_its_payload_at_submit(declared):
    with pytest.raises(ValidationError, match=r"thumbnail.width: must be >= 16, got 2"):
        submit("thumbnail", {"image": "shoe.png", "width": 2})
    assert not Job.objects.exists()


def test_undeclared_it_is_refused_naming_the_declared_ones(settings):
    with pytest.raises(ValidationError, match=r"unknown domain 'thumbnail'; valid domains: workflow"):
        submit("thumbnail", {"image": "shoe.png"})


def test_recovery_follows_each_declared_domains_own_policy(declared, redis_conn, provider):
    lost = submit("thumbnail", {"image": "lost.png"})
    interrupted = submit("caption", {"subject": "a lost caption"})
    dispatch_now()
    start_like_a_worker(interrupted)  # a worker took it, then died
    redis_conn.flushdb()  # and Redis lost the queued one

    for key in ("thumbnail", "caption"):
        result = Round(policy(key), redis=redis_conn, provider=provider).run_once()
        assert result.ok and result.ran and result.scanned == 1, result

    lost.refresh_from_db()
    interrupted.refresh_from_db()
    # Retry-safe: re-dispatched through the outbox as attempt 2.
    assert (lost.status, lost.attempt) == ("submitted", 2)
    assert JobEvent.objects.filter(job=lost, kind="recovery_redispatch").exists()
    # Not retry-safe and it may have run: outcome_unknown, never a second run on a guess.
    assert (interrupted.status, interrupted.attempt) == ("outcome_unknown", 1)

    dispatch_now()
    run_workers(redis_conn)
    lost.refresh_from_db()
    assert (lost.status, lost.attempt, lost.result) == ("succeeded", 2, {"thumbnail": "lost.png@128w"})
    assert project.RAN == [("thumbnail", lost.pk, 2)]


def test_the_admin_domain_filter_lists_the_declared_domains_and_a_retired_key(declared, admin_client):
    from django.urls import reverse

    from tests.factories import JobFactory

    thumb = submit("thumbnail", {"image": "shoe.png"})
    JobFactory(domain="retired", payload={})
    jobs_url = reverse("admin:dispatch_app_job_changelist")
    page = admin_client.get(jobs_url).content.decode()
    for key in ("?domain__exact=thumbnail", "?domain__exact=caption", "?domain__exact=delivery"):
        assert key in page  # declared, with or without jobs
    assert "retired (not declared)" in page
    filtered = admin_client.get(jobs_url, {"domain__exact": "thumbnail"}).context["cl"].result_list
    assert [job.pk for job in filtered] == [thumb.pk]
    envelopes = admin_client.get(reverse("admin:dispatch_app_dispatchenvelope_changelist")).content.decode()
    assert "?domain__exact=caption" in envelopes
