"""The registry of domains: what a project declares, loaded once, read everywhere.

A domain is declared in a plain module (a ``Domain`` named ``DOMAIN``, or any
``Domain`` object) listed by dotted path in the setting ``PRODUCTFLOW_DOMAINS``
(default: none -- a project runs only what it declares; the five shipped demo
domains are ``DEFAULT_DOMAINS``, declared exactly like a project's own when it
asks for them). A source added with ``add_source()`` adds more at every load:
``DispatchAppConfig.ready`` adds ``dispatch_app.tasks.queues.task_domains``, the
domains of the ``django.tasks`` queues (that package sits above this one in the
import layers, so it is handed in, not imported). ``register()`` adds one from code.

Loading is lazy (the first read), idempotent and thread-safe; a change of
``PRODUCTFLOW_DOMAINS`` (``override_settings`` in tests) reloads it. Nothing
here imports Django models or the worker, so any module may read it.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

import dispatch_app.domains.lanes as lanes
from dispatch_app.domains.base import DEFAULT_TASK_PREFIX, Domain, Field, RecoveryPolicy

# The shipped demo domains: a project asks for them (PRODUCTFLOW_DOMAINS = [*DEFAULT_DOMAINS, ...]); unset means
# none, so a project's admin, runworkers and recovery show only its own queues.
DEFAULT_DOMAINS: tuple[str, ...] = (
    "dispatch_app.domains.workflow",
    "dispatch_app.domains.image_series",
    "dispatch_app.domains.delivery",
    "dispatch_app.domains.partial_edit",
    "dispatch_app.domains.agent",
)
# Keys land in varchar(32) columns and metric labels; queue names in Redis keys, RQ_QUEUES and the
# REDIS_URL_<QUEUE> environment variable, hence the same conservative alphabet for both.
KEY_MAX = 32
QUEUE_MAX = 64
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")


class UnknownDomain(LookupError):
    def __init__(self, key: str):
        super().__init__(f"unknown domain {key!r}; valid domains: {', '.join(domain_keys())}")
        self.key = key


class DomainError(ImproperlyConfigured):
    """A declaration that cannot be registered; the message names the domain and what is wrong."""


_lock = threading.RLock()
_from_code: dict[str, Domain] = {}  # register() calls; they survive a reload
_sources: dict[str, Callable[[], Iterable[Domain]]] = {}  # add_source() calls; read at every load
_domains: dict[str, Domain] | None = None  # everything, once loaded
_loading = False


def _check(domain: object, source: str) -> Domain:
    if not isinstance(domain, Domain):
        raise DomainError(f"{source}: expected a dispatch_app.domains.Domain, got {type(domain).__name__}")
    where = f"domain {domain.key!r} ({source})"
    for what, value, limit in (("key", domain.key, KEY_MAX), ("queue", domain.queue, QUEUE_MAX)):
        if not isinstance(value, str) or not _NAME.match(value):
            raise DomainError(
                f"{where}: {what} {value!r} must be lower-case letters, digits and _ starting with a letter"
            )
        if len(value) > limit:
            raise DomainError(f"{where}: {what} {value!r} is longer than {limit} characters")
    if not _DOTTED.match(domain.task_path or ""):
        raise DomainError(f"{where}: task_path {domain.task_path!r} is not a dotted path to a callable")
    if domain.task_path.startswith(DEFAULT_TASK_PREFIX) and not callable(domain.work):
        raise DomainError(f"{where}: needs work(ctx) (run by the shipped worker) or a task_path of its own")
    if domain.schema is not None and (
        not isinstance(domain.schema, dict) or not all(isinstance(f, Field) for f in domain.schema.values())
    ):
        raise DomainError(f"{where}: schema must be a dict of field name -> Field (or None)")
    if not isinstance(domain.recovery, RecoveryPolicy):
        raise DomainError(f"{where}: recovery must be a RecoveryPolicy, got {type(domain.recovery).__name__}")
    return domain


def _add(into: dict[str, Domain], domain: Domain, others: dict[str, Domain], source: str) -> Domain:
    _check(domain, source)
    known = into.get(domain.key) or others.get(domain.key)
    if known is not None:
        if known == domain:
            return known  # the same declaration reached twice (a module listed and registering itself)
        raise DomainError(
            f"domain {domain.key!r} ({source}) is already registered with a different definition "
            f"(queue {known.queue!r}, task {known.task_path!r}); each key is declared once"
        )
    into[domain.key] = domain
    return domain


def register(domain: Domain) -> Domain:
    """Add a domain from code (e.g. an AppConfig.ready()); the same declaration twice is a no-op."""
    with _lock:
        others = _domains if _domains is not None else {}
        registered = _add(_from_code, domain, others, "register()")
        if _domains is not None and registered.key not in _domains:
            # Copied, not changed in place: a reader may be iterating the one it holds.
            _set_loaded({**_domains, registered.key: registered})
        return registered


# Called with every declared queue whenever the set of domains is loaded (``on_loaded``): the RQ side gives each
# queue its RQ_QUEUES entry (``rq.servers.add_queue_entries``, handed down at app start-up).
_loaded_hooks: list = []


def on_loaded(hook) -> None:
    """Call ``hook(queues)`` (every declared queue, in order) now and each time the domains are loaded again."""
    if hook not in _loaded_hooks:
        _loaded_hooks.append(hook)
    if _domains is not None:
        hook(queue_names())


def _set_loaded(domains: dict[str, Domain]) -> None:
    global _domains
    _domains = domains
    queues = tuple(dict.fromkeys(d.queue for d in domains.values()))
    for hook in _loaded_hooks:
        hook(queues)


def _resolve(path: object) -> list[Domain]:
    if not isinstance(path, str) or not _DOTTED.match(path):
        raise DomainError(f"PRODUCTFLOW_DOMAINS: {path!r} is not a dotted path to a module or a Domain")
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name != path:
            raise  # the module exists but imports something missing: show that error, not ours
    else:
        if not hasattr(module, "DOMAIN"):
            raise DomainError(f"PRODUCTFLOW_DOMAINS: module {path!r} has no DOMAIN")
        return [module.DOMAIN]
    module_path, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError):
        raise DomainError(f"PRODUCTFLOW_DOMAINS: cannot import {path!r} (neither a module nor a Domain)") from None
    return [obj]


def add_source(name: str, source: Callable[[], Iterable[Domain]]) -> None:
    """Have every load add the domains ``source()`` returns (after PRODUCTFLOW_DOMAINS, before register()).

    For domains declared by settings a higher layer reads (``dispatch_app.tasks.queues.task_domains``, added
    by ``DispatchAppConfig.ready``). Adding one forgets what was loaded, so the next read includes it.
    """
    with _lock:
        _sources[name] = source
        reset()


def _load() -> dict[str, Domain]:
    global _loading
    domains = _domains
    if domains is not None:
        return domains  # loaded: no lock on the read path (the worker reads it once per job)
    with _lock:
        if _domains is not None:
            return _domains
        if _loading:
            raise ImproperlyConfigured("the domain registry was read while it loads (a domain module reads it)")
        _loading = True
        try:
            paths = getattr(settings, "PRODUCTFLOW_DOMAINS", ())
            if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
                raise DomainError(f"PRODUCTFLOW_DOMAINS must be a list of dotted paths, got {paths!r}")
            loaded: dict[str, Domain] = {}
            for path in paths:
                for domain in _resolve(path):
                    _add(loaded, domain, {}, f"PRODUCTFLOW_DOMAINS {path!r}")
            for name, source in tuple(_sources.items()):
                for domain in source():
                    _add(loaded, domain, {}, name)
            for domain in _from_code.values():
                _add(loaded, domain, {}, "register()")
            _set_loaded(loaded)
        finally:
            _loading = False
        return _domains


def reset() -> None:
    """Forget what was loaded (settings changed); the next read loads again."""
    global _domains
    with _lock:
        _domains = None


@contextmanager
def replaced(domain: Domain) -> Iterator[Domain]:
    """Tests: swap one registered domain's definition (same key) for the block."""
    with _lock:
        domains = _load()
        before = domains[domain.key]
        domains[domain.key] = _check(domain, "replaced()")
    try:
        yield domain
    finally:
        with _lock:
            if _domains is domains:
                domains[domain.key] = before


def get_domain(key: str) -> Domain:
    try:
        return _load()[key]
    except (KeyError, TypeError):
        raise UnknownDomain(key) from None


def all_domains() -> tuple[Domain, ...]:
    return tuple(_load().values())


def domain_keys() -> tuple[str, ...]:
    return tuple(_load())


def queue_names() -> tuple[str, ...]:
    """Every declared queue once, in declaration order."""
    return tuple(dict.fromkeys(d.queue for d in _load().values()))


def lane_queue_names() -> tuple[str, ...]:
    """Every RQ queue of every declared queue's lanes: all new lanes first, then the late ones (``lanes``)."""
    declared = queue_names()
    return tuple(lanes.queue_name(q, lane) for lane in lanes.LANES for q in declared)


def is_registered(key: str) -> bool:
    return key in _load()


def lane_domains(queue: str) -> tuple[str, ...]:
    """The keys of the domains whose queue has the RQ queue ``queue`` as a lane."""
    return tuple(d.key for d in _load().values() if queue in lanes.queues(d.queue))
