"""The registry of business domains, keyed by their stable names."""

from __future__ import annotations

from dispatch_app.domains import agent, delivery, image_series, partial_edit, workflow
from dispatch_app.domains.base import Domain, PayloadError

REGISTRY: dict[str, Domain] = {
    module.DOMAIN.key: module.DOMAIN for module in (workflow, image_series, delivery, partial_edit, agent)
}
DOMAIN_KEYS: tuple[str, ...] = tuple(REGISTRY)
QUEUE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(d.queue for d in REGISTRY.values()))


class UnknownDomain(LookupError):
    def __init__(self, key: str):
        super().__init__(f"unknown domain {key!r}; valid domains: {', '.join(DOMAIN_KEYS)}")
        self.key = key


def get_domain(key: str) -> Domain:
    try:
        return REGISTRY[key]
    except (KeyError, TypeError):
        raise UnknownDomain(key) from None


__all__ = ["DOMAIN_KEYS", "QUEUE_NAMES", "REGISTRY", "Domain", "PayloadError", "UnknownDomain", "get_domain"]
