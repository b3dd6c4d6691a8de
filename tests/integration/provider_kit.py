"""A provider that counts its calls: the real local provider underneath, installed for one test."""

from __future__ import annotations

import threading

from dispatch_app.domains.providers import LocalProvider, set_provider


class CountingProvider(LocalProvider):
    def __init__(self, root):
        super().__init__(root=root, latency_ms=0, failure_rate=0)
        self._lock = threading.Lock()
        self.deliveries = 0

    def deliver(self, asset: str, target: str) -> dict:
        with self._lock:
            self.deliveries += 1
        return super().deliver(asset, target)


def installed(root):
    """For a fixture: ``yield from installed(tmp_path)``."""
    counting = CountingProvider(root)
    set_provider(counting)
    yield counting
    set_provider(None)
