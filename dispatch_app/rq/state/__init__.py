"""What RQ holds, read for the operator pages and recovery: queues, lanes, workers, one job's RQ side, worker health."""
