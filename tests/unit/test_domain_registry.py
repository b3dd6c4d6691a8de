"""The domain registry: what a project declares, with clear errors for what cannot be registered."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_app.domains import (
    DEFAULT_DOMAINS,
    Domain,
    DomainError,
    UnknownDomain,
    all_domains,
    domain_keys,
    get_domain,
    queue_names,
    register,
    registry,
)
from dispatch_app.rq.worker.launch import parse_queues
from tests.project import domains as project

ROOT = Path(__file__).resolve().parents[2]
PROJECT = [*DEFAULT_DOMAINS, "tests.project.domains", "tests.project.domains.CAPTIONS"]


@pytest.fixture
def isolated(settings, monkeypatch):
    """Registrations from code and the RQ_QUEUES entries a load adds stay inside the test."""
    settings.RQ_QUEUES = {name: dict(entry) for name, entry in settings.RQ_QUEUES.items()}
    monkeypatch.setattr(registry, "_from_code", {})
    registry.reset()
    yield settings
    registry.reset()


@pytest.fixture
def declared(isolated):
    isolated.PRODUCTFLOW_DOMAINS = PROJECT
    return isolated


def _work(ctx):
    return {}


def test_unset_declares_no_demo_domain_only_the_projects_task_queues(isolated):
    del isolated.PRODUCTFLOW_DOMAINS  # unset: a project runs what it declares, never the demo's five
    assert not set(domain_keys()) & {"workflow", "image_series", "delivery", "partial_edit", "agent"}
    assert set(domain_keys()) == {queue for backend in isolated.TASKS.values() for queue in backend["QUEUES"]}


def test_the_shipped_domains_are_declared_when_asked_for(isolated):
    isolated.PRODUCTFLOW_DOMAINS = list(DEFAULT_DOMAINS)
    assert domain_keys()[:5] == ("workflow", "image_series", "delivery", "partial_edit", "agent")
    assert [d.key for d in all_domains()][:5] == list(domain_keys()[:5])


def test_a_project_declares_its_domains_by_module_or_by_object(declared):
    assert get_domain("thumbnail") is project.DOMAIN
    assert get_domain("caption") is project.CAPTIONS
    assert get_domain("thumbnail").task_path == "dispatch_app.run.thumbnail"
    # One queue for both, listed once.
    assert queue_names().count("media") == 1
    assert "media" in declared.RQ_QUEUES
    assert declared.RQ_QUEUES["media"]["URL"] == declared.RQ_QUEUES["default"]["URL"]


def test_a_declared_queue_on_its_own_redis_gets_the_bounded_timeouts(isolated, monkeypatch):
    monkeypatch.setenv("REDIS_URL_MEDIA", "redis://media-redis:6379/3")
    isolated.PRODUCTFLOW_DOMAINS = PROJECT
    url = isolated.RQ_QUEUES["media"]["URL"] if queue_names() else None
    assert url.startswith("redis://media-redis:6379/3?socket_timeout=") and "socket_connect_timeout=" in url


def test_an_rq_queues_entry_the_project_wrote_is_kept(isolated):
    isolated.RQ_QUEUES["media"] = {"URL": "redis://mine:6379/9"}
    isolated.PRODUCTFLOW_DOMAINS = PROJECT
    assert "media" in queue_names()
    assert isolated.RQ_QUEUES["media"] == {"URL": "redis://mine:6379/9"}


def test_runworkers_serves_every_declared_queue_by_default(declared):
    assert parse_queues(None) == queue_names()
    assert "media" in parse_queues(None)
    assert parse_queues("media") == ("media",)


def test_an_unknown_domain_names_the_declared_ones(declared):
    with pytest.raises(UnknownDomain, match=r"unknown domain 'thumbnails'; valid domains: .*thumbnail, caption"):
        get_domain("thumbnails")


def test_the_same_declaration_twice_is_one_domain(isolated):
    isolated.PRODUCTFLOW_DOMAINS = [*PROJECT, "tests.project.domains"]
    assert domain_keys().count("thumbnail") == 1
    assert register(project.DOMAIN) is project.DOMAIN


def test_a_key_declared_twice_differently_is_refused_naming_both(isolated):
    other = dataclasses.replace(project.DOMAIN, queue="elsewhere")
    register(other)
    isolated.PRODUCTFLOW_DOMAINS = PROJECT
    with pytest.raises(DomainError, match=r"domain 'thumbnail' \(register\(\)\) is already registered .*queue 'media'"):
        domain_keys()


def test_register_from_code_joins_the_declared_ones_and_survives_a_reload(isolated):
    extra = Domain(key="archive", queue="archive", schema={}, work=_work)
    assert register(extra) is extra
    assert get_domain("archive") is extra
    isolated.PRODUCTFLOW_DOMAINS = list(DEFAULT_DOMAINS)  # a settings change reloads
    assert get_domain("archive") is extra
    assert "archive" in isolated.RQ_QUEUES
    with pytest.raises(DomainError, match="already registered with a different definition"):
        register(dataclasses.replace(extra, description="another"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "Thumbnail"}, r"key 'Thumbnail' must be lower-case letters, digits and _ starting with a letter"),
        ({"key": "thumb-nail"}, r"key 'thumb-nail' must be lower-case"),
        ({"key": "9lives"}, r"key '9lives' must be lower-case"),
        ({"key": "k" * 33}, r"key 'k{33}' is longer than 32 characters"),
        ({"queue": "media queue"}, r"queue 'media queue' must be lower-case"),
        ({"queue": "q" * 65}, r"queue 'q{65}' is longer than 64 characters"),
        ({"task_path": "not a path"}, r"task_path 'not a path' is not a dotted path"),
        ({"work": None}, r"needs work\(ctx\) \(run by the shipped worker\) or a task_path of its own"),
        ({"schema": {"image": str}}, r"schema must be a dict of field name -> Field"),
        ({"recovery": {"retry_safe": True}}, r"recovery must be a RecoveryPolicy, got dict"),
    ],
)
def test_a_bad_declaration_is_refused_naming_what_is_wrong(isolated, change, message):
    with pytest.raises(DomainError, match=message):
        register(dataclasses.replace(project.DOMAIN, **change))


def test_a_domain_with_its_own_task_needs_no_work(isolated):
    own = Domain(key="billing", queue="billing", task_path="tests.project.domains.make_thumbnail")
    assert register(own).work is None


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ("tests.project.domains", r"PRODUCTFLOW_DOMAINS must be a list of dotted paths, got 'tests.project.domains'"),
        (["tests.project"], r"PRODUCTFLOW_DOMAINS: module 'tests.project' has no DOMAIN"),
        (["tests.project.domains.nothing"], r"cannot import 'tests.project.domains.nothing'"),
        (["tests.project.domains.RAN"], r"DOMAINS 'tests.project.domains.RAN': expected a .*Domain, got list"),
        (["not a path"], r"PRODUCTFLOW_DOMAINS: 'not a path' is not a dotted path"),
    ],
)
def test_a_bad_productflow_domains_setting_is_a_clear_error(isolated, paths, message):
    isolated.PRODUCTFLOW_DOMAINS = paths
    with pytest.raises(DomainError, match=message):
        domain_keys()


def test_the_dispatch_recovery_setting_checks_against_the_declared_domains(declared):
    from django.core.exceptions import ImproperlyConfigured

    from dispatch_app.config.settings import validate

    assert validate({"RECOVERY": {"thumbnail": {"MAX_ATTEMPTS": 2}}}).RECOVERY == {"thumbnail": {"MAX_ATTEMPTS": 2}}
    with pytest.raises(ImproperlyConfigured, match=r"'thumbnale'\] is not a domain; did you mean 'thumbnail'\?"):
        validate({"RECOVERY": {"thumbnale": {}}})


# --- no import cycle: conf / recovery.policy / domains / worker -------------------------------------------

NO_LAZY_IMPORTS = [
    "dispatch_app/config/settings.py",
    "dispatch_app/config/values.py",
    "dispatch_app/domains/policy.py",
    "dispatch_app/domains/base.py",
    *(f"dispatch_app/domains/{path.split('.')[-1]}.py" for path in DEFAULT_DOMAINS),
]


@pytest.mark.parametrize("path", NO_LAZY_IMPORTS)
def test_these_modules_import_only_at_the_top(path):
    tree = ast.parse((ROOT / path).read_text())
    top = set(map(id, tree.body))
    nested = [
        node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top
    ]
    assert nested == [], f"{path}: imports inside functions at lines {nested}"


@pytest.mark.parametrize(
    "first",
    [
        "dispatch_app.config.settings",
        "dispatch_app.domains.policy",
        "dispatch_app.domains.delivery",
        "dispatch_app.domains",
    ],
)
def test_any_import_order_works_and_no_domain_imports_the_worker(first):
    code = (
        f"import sys, {first}, dispatch_app.config.settings, dispatch_app.domains.policy\n"
        "import dispatch_app.domains.delivery, dispatch_app.domains.agent\n"
        "assert 'dispatch_app.execution' not in sys.modules, 'a domain module imported the worker'\n"
        "assert 'dispatch_app.models' not in sys.modules, 'settings-time modules imported the models'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_shipped_entry_point_always_names_the_domains_own_key():
    copy = dataclasses.replace(project.DOMAIN, key="thumbnail_v2")
    assert copy.task_path == "dispatch_app.run.thumbnail_v2"
    own = Domain(key="billing", queue="billing", task_path="myapp.tasks.bill")
    assert dataclasses.replace(own, key="billing_v2").task_path == "myapp.tasks.bill"
