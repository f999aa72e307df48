"""The worker's I/O thread: every Redis round trip of a worker happens here.

It owns the thread loop and the pipeline it sends each cycle (:mod:`.pump`), what each
command of that pipeline was (:mod:`.sent`), the barrier that holds acks until a
request's follow-ups are on a replica (:mod:`.replicas`), handing back leases whose
reply was lost (:mod:`.recovery`), back-off while Redis is away (:mod:`.backoff`) and
refusals logged once (:mod:`.refusals`). It talks to the reactor thread only through
:class:`streams_sched.worker.exchange.Exchange`, and to Redis only through
:class:`streams_sched.frontier.client.Frontier`. It may import everything under
:mod:`streams_sched.worker` except the scheduler itself.
"""
