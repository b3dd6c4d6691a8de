"""The commands that write to Redis refuse to start on a Redis database another live deployment uses.

Called after ``require_migrated`` (the deployment's namespace is read from the database): every server the
process's queues live on is checked and this deployment registered there (``dispatch_app.rq.deployment``). A server
that does not answer now is not a reason to stay down (a Redis outage is waited out as always); it is named in
the log, and the process's heartbeat registers it, and says so if another deployment is there, once it answers.
"""

from __future__ import annotations

import logging

from django.core.management.base import CommandError

import dispatch_app.domains.lanes as lanes
import dispatch_app.rq.deployment as deployment
import dispatch_app.rq.servers as redis_servers
from dispatch_app.domains import all_domains
from dispatch_app.management.commands._migrated import answered

log = logging.getLogger("dispatch_app.startup")


def require_own_redis(queues=None, *, register: bool = True) -> deployment.Identity:
    """Raise CommandError (exit code 2) naming both deployments when another live one uses our Redis database.

    ``register=False``: look only (a dry run writes nothing to Redis)."""
    names = queues or [lane for d in all_domains() for lane in lanes.queues(d.queue)]
    urls = redis_servers.by_server(names) or {redis_servers.queue_url("default"): []}
    servers = {redis_servers.label(url): redis_servers.connection(url) for url in urls}
    me = answered(deployment.identity)  # a database restarting now is waited out, as the migrations' check does
    try:
        unreached = deployment.refuse_if_shared(servers, me, register=register)
    except deployment.SharedRedis as exc:
        raise CommandError(str(exc), returncode=2) from None
    for label in unreached:
        log.warning(
            "Redis %s did not answer the start-up check that no other deployment uses it; the heartbeat checks it "
            "once it answers",
            label,
            extra={"action": "deployment_check_postponed", "domain": "startup"},
        )
    log.info(
        "deployment %s (%s) %s on %s",
        me.namespace,
        me.description,
        "registered" if register else "checked",
        ", ".join(servers),
        extra={"action": "deployment_registered", "domain": "startup"},
    )
    return me
