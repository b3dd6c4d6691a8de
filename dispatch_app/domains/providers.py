"""The provider interface (image vendor, delivery target, tool runner) and the
local provider that stands in for them.

A real vendor client implements ``Provider``; ``DISPATCH['PROVIDER']`` is not
needed for that — ``set_provider()`` swaps it at start-up. The local provider
writes real PNG files and keeps a durable record per vendor request id, so
recovery can ask "what happened to request R?" across processes.

Every call is bounded: a provider honours its ``timeout`` (``DISPATCH['PROVIDER_TIMEOUT']``)
and raises ``ProviderTimeout`` past it; callers that must never hang on a client
that ignores it (recovery, the vendor-call ledger) also wrap the call in
``call_with_timeout``.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import random
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from django.conf import settings

import dispatch_app.config.failpoints as failpoints
from dispatch_app.config.settings import dispatch_settings

T = TypeVar("T")


class ProviderError(RuntimeError):
    """The vendor answered with a failure (known outcome: the call did not take effect)."""


class ProviderTimeout(RuntimeError):
    """No answer within the timeout: the call may or may not have taken effect (ask the vendor later).

    Not a ``ProviderError``: retrying it blindly could bill the call twice.
    """


class Provider(Protocol):
    # Seconds any one call may take, status calls included; past it the call raises ProviderTimeout.
    timeout: float

    def new_request_id(self) -> str: ...
    def generate_image(self, request_id: str, prompt: str, size: int, seed: int) -> Path: ...
    def edit_image(self, request_id: str, source: str, region: list[int], instruction: str) -> Path: ...
    def deliver(self, asset: str, target: str) -> dict: ...
    def run_step(self, name: str, context: dict, request_id: str | None = None) -> dict: ...
    def request_status(self, request_id: str) -> str:
        """'succeeded', 'failed', 'pending' or 'unknown' (the vendor never saw it)."""


class _CallThread:
    """A daemon thread that runs the calls of one caller thread, one at a time.

    Starting a thread per call cost ~0.15 ms of CPU (a third of a local
    vendor call); this one is reused until a call outlives its timeout. Then it
    is abandoned: the caller gets a new one, and this one ends once that call
    finally returns.
    """

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="vendor-call", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            done.set()


_call_threads = threading.local()


def call_with_timeout(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run ``fn`` on a helper thread and give up waiting after ``timeout`` seconds.

    The guard for a client that does not honour its own timeout: the caller moves
    on with ``ProviderTimeout`` (outcome unknown); the abandoned thread is a
    daemon and ends when the call finally returns.
    """
    runner = getattr(_call_threads, "runner", None)
    if runner is None or not runner.thread.is_alive():
        runner = _call_threads.runner = _CallThread()
    box: dict[str, Any] = {}
    done = threading.Event()
    runner.inbox.put((fn, box, done))
    try:
        answered = done.wait(timeout)
    finally:
        if not done.is_set():  # timed out, or interrupted (a job timeout's signal): the call goes on alone
            _call_threads.runner = None
            runner.inbox.put(None)  # ends the thread after the call it is stuck in
    if not answered:
        raise ProviderTimeout(f"{what}: no answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


# The stand-in vendor's output: a solid-colour PNG per (size, colour). 64 colours keep the cache
# small (at most 64 per size in use) while different seeds still give different-looking images.
_COLOURS = 64


def _colour(seed: int) -> tuple[int, int, int]:
    rng = random.Random(seed % _COLOURS)
    return (rng.randrange(256), rng.randrange(256), rng.randrange(256))


@functools.lru_cache(maxsize=256)
def _solid_png(size: int, colour: tuple[int, int, int]) -> bytes:
    """A valid size x size 8-bit RGB PNG of one colour: signature, IHDR, one IDAT, IEND."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" + bytes(colour) * size  # filter type 0 (none), then the pixels
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    idat = zlib.compress(row * size, 6)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


class LocalProvider:
    """Stands in for the vendors. ``PRODUCTFLOW_PROVIDER_CALL_LOG=<file>`` (tests) appends one line per call
    that reached the vendor, "<op> <request id or -> <succeeded|failed> <pid>", so a test can count the calls
    that took effect."""

    def __init__(
        self,
        root: Path | None = None,
        latency_ms: float | None = None,
        failure_rate: float | None = None,
        timeout: float | None = None,
        call_log: str | None = None,
    ):
        conf = dispatch_settings()
        self.root = Path(root or Path(settings.MEDIA_ROOT))
        self.latency = (conf.PROVIDER_LATENCY_MS if latency_ms is None else latency_ms) / 1000.0
        self.failure_rate = conf.PROVIDER_FAILURE_RATE if failure_rate is None else failure_rate
        self.timeout = conf.PROVIDER_TIMEOUT if timeout is None else timeout
        self.call_log = call_log if call_log is not None else os.environ.get("PRODUCTFLOW_PROVIDER_CALL_LOG", "")
        (self.root / "outputs").mkdir(parents=True, exist_ok=True)
        (self.root / "requests").mkdir(parents=True, exist_ok=True)

    def new_request_id(self) -> str:
        return f"local-{uuid.uuid4().hex}"

    def _request_file(self, request_id: str) -> Path:
        return self.root / "requests" / f"{request_id}.json"

    def _record(self, request_id: str, status: str, **extra) -> None:
        # Write-then-rename: a process killed mid-write leaves the previous record whole, never half a file.
        final = self._request_file(request_id)
        temp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temp.write_text(json.dumps({"status": status, **extra}))
        failpoints.hit(f"kill_vendor_record_{status}")
        os.replace(temp, final)

    def _log(self, op: str, request_id: str | None, outcome: str) -> None:
        if not self.call_log:
            return
        fd = os.open(self.call_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{op} {request_id or '-'} {outcome} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    def _call(self, op: str, request_id: str | None, record: bool = True) -> None:
        if request_id and record:
            self._record(request_id, "pending")
        if self.latency > self.timeout:
            # The vendor would still be working when we stop waiting: the request stays pending.
            time.sleep(self.timeout)
            raise ProviderTimeout(f"local provider: {op} gave no answer within {self.timeout:g}s")
        if self.latency:
            time.sleep(self.latency)  # stands in for the vendor's own latency
        if self.failure_rate and random.random() < self.failure_rate:
            if request_id and record:
                self._record(request_id, "failed")
            self._log(op, request_id, "failed")
            raise ProviderError("local provider: simulated vendor failure")

    def _png(self, name: str, size: int, seed: int) -> Path:
        # Storing the vendor's output is our side's work; rendering it is the vendor's (a real one
        # returns bytes rendered on its own machines). So the stand-in returns a solid-colour PNG from a
        # per-process cache instead of running an encoder on the worker's CPU for every call (Pillow
        # took ~0.35 ms per 16 px image, milliseconds at 1024 px).
        data = _solid_png(size, _colour(seed))
        path = self.root / "outputs" / name
        temp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)
        return path

    def generate_image(self, request_id: str, prompt: str, size: int, seed: int) -> Path:
        self._call("generate_image", request_id)
        path = self._png(f"{request_id}.png", size, seed)
        self._record(request_id, "succeeded", output=str(path))
        self._log("generate_image", request_id, "succeeded")
        return path

    def edit_image(self, request_id: str, source: str, region: list[int], instruction: str) -> Path:
        self._call("edit_image", request_id)
        path = self._png(f"{request_id}.png", max(8, min(256, region[2] or 8)), hash((source, instruction)))
        self._record(request_id, "succeeded", output=str(path))
        self._log("edit_image", request_id, "succeeded")
        return path

    def deliver(self, asset: str, target: str) -> dict:
        self._call("deliver", None)
        self._log("deliver", None, "succeeded")
        return {"delivered": asset, "target": target}

    def run_step(self, name: str, context: dict, request_id: str | None = None) -> dict:
        # Tool runs leave no record to ask about later (unverifiable side effects); the id only labels the call.
        self._call("run_step", request_id, record=False)
        self._log("run_step", request_id, "succeeded")
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
