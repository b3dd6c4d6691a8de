"""The outbox-age alarm: a domain whose oldest due envelope has waited past OUTBOX_AGE_ALARM_SECONDS (since it
became due, on the database clock) is a red banner; a paused domain says paused instead; a resume starts the
wait again. Through board.build() and the rendered live fragment."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from dispatch_app.actions import operator as actions
from dispatch_app.views import board
from tests.integration.opsdata import attempt_row, envelope, job

LIVE = "/admin/dispatch_app/job/dashboard/live/"
pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


def outbox_banners(data) -> list[dict]:
    return [b for b in data["banners"] if b["key"] == "outbox-age"]


def waiting(domain: str, *, due_ago: float, created_ago: float | None = None):
    """A pending envelope due ``due_ago`` seconds ago (created earlier when it was scheduled for later)."""
    j = job(domain, "submitted", submitted_ago=created_ago or due_ago)
    if created_ago is not None:
        attempt_row(j, 1, created_ago=created_ago, due_ago=due_ago)
    return envelope(j, "pending", created_ago=created_ago or due_ago, available_ago=due_ago)


def test_due_envelopes_waiting_past_the_threshold_are_a_red_banner_per_domain(client, redis_conn):
    waiting("agent", due_ago=120)
    waiting("agent", due_ago=5)
    # Scheduled an hour ago for 10 s ago: it has waited 10 s, not an hour.
    waiting("delivery", due_ago=10, created_ago=3600)
    # Leased (being sent, or its dispatcher died): not due until the lease ends.
    leased = job("workflow", "submitted", submitted_ago=300)
    envelope(leased, "pending", created_ago=300, available_ago=-20)

    data = board.build(redis_conn=redis_conn)
    (banner,) = outbox_banners(data)
    assert banner["level"] == "error" and banner["domain"] == "agent"
    assert banner["text"].startswith("agent: the oldest due envelope has waited 2.0 min in the outbox (2 due")
    assert "OUTBOX_AGE_ALARM_SECONDS" in banner["text"]
    assert data["domains"]["delivery"]["outbox_due"]["oldest_due_age"] == pytest.approx(10, abs=2)
    assert data["domains"]["delivery"]["outbox_due"]["alarm"] is False
    assert data["domains"]["workflow"]["outbox_due"] is None

    client.force_login(User.objects.create_superuser("op", password="pw"))
    page = client.get(LIVE).content.decode()
    assert 'data-key="outbox-age"' in page and "the oldest due envelope has waited" in page
    cell = page.split('id="pf-due-wait-agent"')[1].split("</span>")[0]
    assert "oldest due: 2.0 min (over 30 s)" in cell

    with override_settings(DISPATCH={"OUTBOX_AGE_ALARM_SECONDS": 200}):
        assert outbox_banners(board.build(redis_conn=redis_conn)) == []


def test_a_paused_domain_says_paused_and_a_resume_starts_its_wait_again(redis_conn):
    waiting("agent", due_ago=120)
    operator = User.objects.create_superuser("op", password="pw")
    actions.pause_domain("agent", user=operator, reason="vendor down")
    data = board.build(redis_conn=redis_conn)
    assert outbox_banners(data) == []
    (paused,) = [b["text"] for b in data["banners"] if b["key"] == "paused"]
    assert "1 due envelope(s) held, the oldest for" in paused
    assert data["domains"]["agent"]["outbox_due"]["paused"] is True

    actions.resume_domain("agent", user=operator, reason="vendor back")
    data = board.build(redis_conn=redis_conn)
    # Due 2 min ago, but held until a moment ago: no alarm for the paused time.
    assert outbox_banners(data) == []
    assert data["domains"]["agent"]["outbox_due"]["oldest_due_age"] < 30
