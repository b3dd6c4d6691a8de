"""RQ behind one door: everything that knows RQ or its Redis keys, and nothing else imports ``rq``.

- ``internals``: every RQ internal relied on, checked at start-up; ``ids``: the one place an RQ job id is spelled,
  and the dispatcher's signature; ``deployment``: one deployment per Redis database; ``servers``: which Redis a queue
  lives on; ``lanes``: a domain queue's RQ queues; ``errors``: when Redis as a whole refuses; ``junk``: values in
  Redis the project cannot use; ``checks``: django-rq's side doors kept shut.
- ``publish``: the send (create-if-absent scripts); ``state``: what the operator pages and recovery read of RQ.
- ``worker``: the project's RQ worker (``PipelineWorker``); ``worker.entry``: the entry points a job hash names
  (``dispatch_app.run.<domain>`` stays importable: jobs in Redis carry that path).
"""
