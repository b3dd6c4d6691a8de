"""The dispatch loop's breakers: one per Redis server, so one server's outage pauses only the domains on it.

A mapping of server URL -> ``CircuitBreaker``, made as servers are met, with what the loop asks of them all:
may anything be claimed, is any server taking sends, when is the next probe, what did a batch tell each one, and
one state for the observers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import dispatch_app.rq.servers as redis_servers
from dispatch_app.config.tuning import MIN_PROBE_BACKOFF
from dispatch_app.dispatch.breaker import CLOSED, OPEN, BreakerState, CircuitBreaker

log = logging.getLogger("dispatch_app.dispatch")


class Breakers(Mapping):
    def __init__(self, conf, servers, clock: Callable[[], float]):
        self.conf = conf
        self._clock = clock
        self._by_server: dict[str, CircuitBreaker] = {}
        for server in servers:
            self.of(server)

    def __getitem__(self, server: str) -> CircuitBreaker:
        return self._by_server[server]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_server)

    def __len__(self) -> int:
        return len(self._by_server)

    def of(self, server: str) -> CircuitBreaker:
        """The server's breaker, made on first use (a queue whose server the loop had not met)."""
        breaker = self._by_server.get(server)
        if breaker is None:
            conf = self.conf
            breaker = self._by_server[server] = CircuitBreaker(
                max(conf.SEND_BACKOFF_BASE, MIN_PROBE_BACKOFF),
                max(
                    min(conf.SEND_BACKOFF_MAX, conf.SEND_TRANSIENT_BACKOFF_MAX),
                    MIN_PROBE_BACKOFF,
                    conf.SEND_BACKOFF_BASE,
                ),
                clock=self._clock,
            )
        return breaker

    @property
    def default(self) -> CircuitBreaker:
        """The first server's breaker (the only one unless RQ_QUEUES puts domains on their own Redis)."""
        return next(iter(self._by_server.values()))

    def allow_any(self) -> bool:
        """Every breaker is asked (a due one turns half-open); False while every server is paused."""
        return [breaker.allow() for breaker in self._by_server.values()].count(True) > 0

    def any_closed(self) -> bool:
        return any(breaker.state == CLOSED for breaker in self._by_server.values())

    def seconds_to_probe(self) -> list[float]:
        return [p for p in (b.seconds_to_probe() for b in self._by_server.values()) if p is not None]

    def judge(self, record) -> None:
        """Tell each server's breaker what it did with a batch (loop's thread, before the results are written)."""
        if record is None:
            return  # nothing claimed: Redis was not asked; a half-open breaker probes with the next batch
        for server, reason in record.outage_reason.items():
            record.outage_delay[server] = self.of(server).failed(reason, record.outage_error[server])
        for server in record.answered - set(record.outage_reason):
            paused = self.of(server).succeeded()
            if paused:
                log.warning(
                    "dispatch resumed after %.1fs: Redis %s takes sends again",
                    paused,
                    redis_servers.label(server),
                    extra={"action": "dispatch_resumed", "domain": "dispatch"},
                )

    def state(self) -> BreakerState:
        """One state for the observers: the worst server's (open, then half-open), named when there are several."""
        rank = {OPEN: 0, "half_open": 1, CLOSED: 2}
        server, breaker = min(self._by_server.items(), key=lambda item: rank.get(item[1].state, 2))
        state = breaker.snapshot()
        if len(self._by_server) == 1:
            return state
        # Pauses are counted over every server (the observers' counters only ever grow).
        return BreakerState(
            state.state,
            reason=f"{state.reason} [{redis_servers.label(server)}]" if state.state != CLOSED else "",
            error=state.error,
            paused_seconds=state.paused_seconds,
            pauses=sum(b.pauses for b in self._by_server.values()),
            probe_in=state.probe_in,
        )
