"""Database helpers: the database clock, connection checks and retries, prepared statements, session bounds,
liveness."""
