"""The dashboard's recovery counts link to the jobs that round decided that way (a real round on real services)."""

from __future__ import annotations

import re

import pytest

from dispatch_app import submit
from dispatch_app.models import RecoveryRound
from dispatch_app.recovery.round import Round
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.admin.test_admin import DASHBOARD, JOBS, VIEW, staff
from tests.integration.recovery_helpers import dispatch_now, policy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def listed_ids(page: str) -> set[int]:
    return {int(i) for i in re.findall(r"/admin/dispatch_app/job/(\d+)/change/", page)}


def test_a_rounds_redispatched_count_lists_the_jobs_it_redispatched(client, redis_conn, provider):
    lost = [submit("delivery", PAYLOADS["delivery"]) for _ in range(2)]
    dispatch_now()
    redis_conn.flushdb()  # Redis lost both RQ jobs (the test database only)
    result = Round(policy("delivery"), redis=redis_conn, provider=provider).run_once()
    assert result.redispatched == 2
    round_id = RecoveryRound.objects.get(domain="delivery").pk
    bystander = submit("delivery", PAYLOADS["delivery"])  # not decided by that round

    client.force_login(staff("operator", *VIEW))
    dashboard = client.get(DASHBOARD).content.decode()
    link = f"{JOBS}?recovery={round_id}:redispatched"
    assert f'href="{link}"' in dashboard
    page = client.get(link).content.decode()
    assert listed_ids(page) == {j.pk for j in lost}
    assert bystander.pk not in listed_ids(page)
    assert f"round {round_id}: redispatched" in page  # the filter says what the list is

    # A count of zero is not a link; a malformed value filters nothing and fails nothing.
    assert f"?recovery={round_id}:left_alone" not in dashboard
    assert client.get(f"{JOBS}?recovery=nonsense").status_code in (200, 302)
