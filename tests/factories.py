"""factory-boy factories for rows the tests construct directly (bypassing submit on purpose)."""

import factory

from dispatch_app.models import DispatchEnvelope, Job

PAYLOADS = {
    "workflow": {"workflow_id": "wf-1", "steps": ["resize", "tag"]},
    "image_series": {"product_id": "p-1", "prompt": "a red shoe", "count": 1, "size": 16},
    "delivery": {"asset": "asset-1", "target": "https://example.invalid/hook"},
    "partial_edit": {"image": "img-1", "region": [0, 0, 8, 8], "instruction": "make it blue"},
    "agent": {"goal": "write a caption", "max_steps": 1},
}


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    domain = "delivery"
    payload = factory.LazyAttribute(lambda o: dict(PAYLOADS.get(o.domain, {})))


class EnvelopeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DispatchEnvelope

    job = factory.SubFactory(JobFactory)
    attempt = factory.LazyAttribute(lambda o: o.job.attempt)
    domain = factory.LazyAttribute(lambda o: o.job.domain)
    queue = factory.LazyAttribute(lambda o: o.job.domain)
