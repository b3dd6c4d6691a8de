"""What operators read: the dashboard, the numbers, alarms, blockers, a job's timeline. Nothing here writes."""
