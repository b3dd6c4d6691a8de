"""The provider interface (image vendor, delivery target, tool runner) and the
local provider that stands in for them.

A real vendor client implements ``Provider``; ``DISPATCH['PROVIDER']`` is not
needed for that — ``set_provider()`` swaps it at start-up. The local provider
writes real PNG files and keeps a durable record per vendor request id, so
recovery can ask "what happened to request R?" across processes.
"""

from __future__ import annotations

import io
import json
import random
import time
import uuid
from pathlib import Path
from typing import Protocol

from django.conf import settings

from dispatch_app.conf import dispatch_settings


class ProviderError(RuntimeError):
    """The vendor answered with a failure (known outcome: the call did not take effect)."""


class Provider(Protocol):
    def new_request_id(self) -> str: ...
    def generate_image(self, request_id: str, prompt: str, size: int, seed: int) -> Path: ...
    def edit_image(self, request_id: str, source: str, region: list[int], instruction: str) -> Path: ...
    def deliver(self, asset: str, target: str) -> dict: ...
    def run_step(self, name: str, context: dict) -> dict: ...
    def request_status(self, request_id: str) -> str:
        """'succeeded', 'failed', 'pending' or 'unknown' (the vendor never saw it)."""


class LocalProvider:
    def __init__(self, root: Path | None = None, latency_ms: float | None = None, failure_rate: float | None = None):
        conf = dispatch_settings()
        self.root = Path(root or Path(settings.MEDIA_ROOT))
        self.latency = (conf.PROVIDER_LATENCY_MS if latency_ms is None else latency_ms) / 1000.0
        self.failure_rate = conf.PROVIDER_FAILURE_RATE if failure_rate is None else failure_rate
        (self.root / "outputs").mkdir(parents=True, exist_ok=True)
        (self.root / "requests").mkdir(parents=True, exist_ok=True)

    def new_request_id(self) -> str:
        return f"local-{uuid.uuid4().hex}"

    def _request_file(self, request_id: str) -> Path:
        return self.root / "requests" / f"{request_id}.json"

    def _record(self, request_id: str, status: str, **extra) -> None:
        self._request_file(request_id).write_text(json.dumps({"status": status, **extra}))

    def _call(self, request_id: str | None) -> None:
        if request_id:
            self._record(request_id, "pending")
        if self.latency:
            time.sleep(self.latency)  # stands in for the vendor's own latency
        if self.failure_rate and random.random() < self.failure_rate:
            if request_id:
                self._record(request_id, "failed")
            raise ProviderError("local provider: simulated vendor failure")

    def _png(self, name: str, size: int, seed: int) -> Path:
        from PIL import Image

        rng = random.Random(seed)
        colour = tuple(rng.randrange(256) for _ in range(3))
        image = Image.new("RGB", (size, size), colour)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        path = self.root / "outputs" / name
        path.write_bytes(buffer.getvalue())
        return path

    def generate_image(self, request_id: str, prompt: str, size: int, seed: int) -> Path:
        self._call(request_id)
        path = self._png(f"{request_id}.png", size, seed)
        self._record(request_id, "succeeded", output=str(path))
        return path

    def edit_image(self, request_id: str, source: str, region: list[int], instruction: str) -> Path:
        self._call(request_id)
        path = self._png(f"{request_id}.png", max(8, min(256, region[2] or 8)), hash((source, instruction)))
        self._record(request_id, "succeeded", output=str(path))
        return path

    def deliver(self, asset: str, target: str) -> dict:
        self._call(None)
        return {"delivered": asset, "target": target}

    def run_step(self, name: str, context: dict) -> dict:
        self._call(None)
        return {"step": name, "ok": True}

    def request_status(self, request_id: str) -> str:
        path = self._request_file(request_id)
        if not path.exists():
            return "unknown"
        return json.loads(path.read_text())["status"]


_provider: Provider | None = None


def get_provider() -> Provider:
    global _provider
    if _provider is None:
        _provider = LocalProvider()
    return _provider


def set_provider(provider: Provider | None) -> None:
    """Install a real vendor client (or reset to the local one with None)."""
    global _provider
    _provider = provider
