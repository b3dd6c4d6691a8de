"""ProductFlow Dispatch: from "committed in PostgreSQL" to "running on an RQ worker"."""


def __getattr__(name):
    # Lazy, so settings can import dispatch_app.domains before Django is set up.
    if name in {"submit", "submit_many", "JobSpec"}:
        import dispatch_app.outbox.submit as outbox

        return getattr(outbox, name)
    raise AttributeError(name)
