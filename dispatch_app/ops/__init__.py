"""Operations: what operators see (stats, metrics) and the housekeeping loops (heartbeat, retention).

``stats`` holds every SQL query the dashboard, ``dispatchstats`` and the
Prometheus collector share; ``actions`` holds the operator actions, which
change state only through the outbox tables.
"""
