"""RQ job functions of the benchmark's own (the ``rq-noop`` baseline of ``worker-ceiling``)."""


def noop(i: int) -> None:
    """Nothing: what is left is RQ's own per-job cost."""
    return None
