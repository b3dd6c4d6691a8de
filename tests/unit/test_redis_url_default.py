"""A project that configures only django-rq's RQ_QUEUES gets a bounded REDIS_URL from it (apps.ready)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from dispatch_app.rq import servers as redis_servers

pytestmark = pytest.mark.path_dependent


@pytest.fixture
def project(settings):
    del settings.REDIS_URL
    settings.RQ_QUEUES = {"default": {"URL": "redis://cache.internal:6380/3", "SERIALIZER": "json"}}
    return settings


def test_redis_url_is_the_default_queues_server_with_bounded_calls(project):
    url = redis_servers.ensure_redis_url()
    assert url == project.REDIS_URL == project.RQ_QUEUES["default"]["URL"]
    assert url.startswith("redis://cache.internal:6380/3?")
    assert "socket_timeout=5.0" in url and "socket_connect_timeout=5.0" in url


def test_a_timeout_the_project_chose_is_kept(project):
    project.RQ_QUEUES["default"]["URL"] = "redis://cache.internal:6380/3?socket_timeout=2"
    project.REDIS_SOCKET_TIMEOUT = 9.0
    url = redis_servers.ensure_redis_url()
    assert project.RQ_QUEUES["default"]["URL"] == "redis://cache.internal:6380/3?socket_timeout=2"
    assert url.startswith("redis://cache.internal:6380/3?socket_timeout=2&") and "socket_timeout=9" not in url


def test_an_entry_by_host_and_port_names_the_same_server(project):
    project.RQ_QUEUES = {"default": {"HOST": "cache.internal", "PORT": 6390, "DB": 2}}
    assert redis_servers.ensure_redis_url().startswith("redis://cache.internal:6390/2?socket_timeout=5.0")


def test_no_default_queue_and_no_redis_url_stops_start_up_naming_the_setting(project):
    project.RQ_QUEUES = {}
    with pytest.raises(ImproperlyConfigured, match=r'RQ_QUEUES\["default"\]'):
        redis_servers.ensure_redis_url()


def test_a_set_redis_url_is_left_as_it_is(settings):
    before = settings.REDIS_URL
    assert redis_servers.ensure_redis_url() == before
