"""Operator actions: each changes state only through the store (the outbox tables); nothing here talks to Redis."""
