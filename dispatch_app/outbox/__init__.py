"""The outbox write: a job and its envelope in one transaction (``submit``), and what a payload may hold."""
