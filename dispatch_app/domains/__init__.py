"""Business domains: what one is (``base``) and the registry of the declared ones (``registry``)."""

from __future__ import annotations

import dispatch_app.domains.registry as registry
from dispatch_app.domains.base import Domain, Field, PayloadError, RecoveryPolicy
from dispatch_app.domains.registry import (
    DEFAULT_DOMAINS,
    DomainError,
    UnknownDomain,
    all_domains,
    domain_keys,
    get_domain,
    is_registered,
    lane_queue_names,
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
    "lane_queue_names",
    "queue_names",
    "register",
    "registry",
]
