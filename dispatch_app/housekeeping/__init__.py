"""The dispatcher's housekeeping: heartbeats, retention, metrics, and the wiring that adds them to a process."""
