"""factory-boy factories for rows the tests construct directly (bypassing submit on purpose)."""

import factory

from dispatch_app.domains.demo_payloads import demo_domain_keys, demo_payload
from dispatch_app.models import DispatchEnvelope, Job

PAYLOADS = {domain: demo_payload(domain, 1) for domain in demo_domain_keys()}


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
