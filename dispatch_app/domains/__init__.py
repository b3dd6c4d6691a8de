"""Business domains: what one is (``base``) and the registry of the declared ones (``registry``)."""

from __future__ import annotations

from dispatch_app.domains.base import Domain, Field, PayloadError, RecoveryPolicy
from dispatch_app.domains.registry import (
    DEFAULT_DOMAINS,
    DomainError,
    UnknownDomain,
    all_domains,
    domain_keys,
    get_domain,
    is_registered,
    queue_names,
    register,
)

__all__ = [
    "DEFAULT_DOMAINS",
    "Domain",
    "DomainError",
    "Field",
    "PayloadError",
    "RecoveryPolicy",
    "UnknownDomain",
    "all_domains",
    "domain_keys",
    "get_domain",
    "is_registered",
    "queue_names",
    "register",
]


def __getattr__(name: str):
    # The constants this package had before the registry, for code not yet moved to the functions
    # above. REGISTRY is the live mapping (tests may monkeypatch.setitem it).
    from dispatch_app.domains import registry

    if name == "REGISTRY":
        return registry._load()
    if name == "DOMAIN_KEYS":
        return registry.domain_keys()
    if name == "QUEUE_NAMES":
        return registry.queue_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
