"""A job's timeline: its stages (one definition, in Python and SQL), the demo's latency table, tracing spans."""
