"""Valid demo payloads per domain (loadgen, the demo, tests)."""

from __future__ import annotations


def demo_payload(domain: str, index: int = 0) -> dict:
    builders = {
        "workflow": lambda i: {"workflow_id": f"wf-{i}", "steps": ["fetch", "resize", "tag"]},
        "image_series": lambda i: {"product_id": f"p-{i}", "prompt": f"product shot {i}", "count": 1, "size": 16},
        "delivery": lambda i: {"asset": f"asset-{i}", "target": f"https://cdn.example.invalid/{i}"},
        "partial_edit": lambda i: {"image": f"img-{i}", "region": [0, 0, 8, 8], "instruction": "brighter"},
        "agent": lambda i: {"goal": f"write a caption for product {i}", "max_steps": 2},
    }
    try:
        return builders[domain](index)
    except KeyError:
        raise ValueError(f"no demo payload for domain {domain!r}") from None


def demo_domain_keys() -> list[str]:
    """The registered domains the demo, loadgen and the tests' factories run: those with a demo payload
    (the shipped five), never a django.tasks queue's domain (its jobs name a task of the project's own)."""
    from dispatch_app.domains import domain_keys

    keys = []
    for key in domain_keys():
        try:
            demo_payload(key)
        except ValueError:
            continue
        keys.append(key)
    return keys
