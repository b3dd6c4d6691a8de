"""Child process for the fault suite: submits jobs through the real outbox API.

Reads one JSON request per line on stdin ({"count", "domain", "prefix", "delay"}, optionally
"payloads": the jobs' payloads as given, instead of generated ones, and "group": jobs per transaction),
submits in transactions of 250 (or "group") through ``submit_many`` and answers one JSON line
with the new job ids. Its database connection stays open between requests.
"""

import json
import sys
from datetime import timedelta


def main() -> None:
    import django

    django.setup()
    from django.db import close_old_connections

    from dispatch_app.outbox.submit import JobSpec, submit_many

    def payload(domain: str, prefix: str, index: int) -> dict:
        from dispatch_app.domains.demo_payloads import demo_payload

        if domain == "delivery":
            return {"asset": f"{prefix}-{index}", "target": f"https://target.example.invalid/{prefix}/{index}"}
        return demo_payload(domain, index)

    for line in sys.stdin:
        request = json.loads(line)
        # As a web request would: a session a server restart killed is replaced, not failed on again.
        close_old_connections()
        try:
            delay = timedelta(seconds=request["delay"]) if request.get("delay") else None
            ids = []
            given = request.get("payloads")
            count = len(given) if given is not None else request["count"]
            group = int(request.get("group") or 250)
            for start in range(0, count, group):
                specs = [
                    JobSpec(
                        request["domain"],
                        given[i] if given is not None else payload(request["domain"], request["prefix"], i),
                        delay,
                    )
                    for i in range(start, min(start + group, count))
                ]
                ids.extend(job.pk for job in submit_many(specs))
            reply = {"ids": ids}
        except Exception as exc:  # reported to the test, which fails with it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
