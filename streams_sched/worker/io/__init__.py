"""The worker's I/O thread: every Redis round trip of a worker happens here.

It owns the thread loop and one cycle (:mod:`.pump`) and the cycle's stages, in order:
the writes it sends (:mod:`.writes`), the barrier that holds acks until a request's
follow-ups are on a replica (:mod:`.barrier`, deciding with :mod:`.replicas`), lease
calls and what their replies teach (:mod:`.leasing`), applying a pipeline's replies
(:mod:`.replies`, with :mod:`.sent`), idle-time work (:mod:`.upkeep`, :mod:`.feeding`),
the heartbeat (:mod:`.presence`), outages and refusals (:mod:`.trouble`,
:mod:`.refusals`, :mod:`.backoff`) and handing back leases whose reply was lost
(:mod:`.recovery`). It talks to the reactor thread only through
:class:`streams_sched.worker.exchange.Exchange`, and to Redis only through
:class:`streams_sched.frontier.client.Frontier` and the replica barrier. It may import
the reactor side's shared objects under :mod:`streams_sched.worker` (exchange, ops,
leasebook, selection), :mod:`streams_sched.wire`, :mod:`streams_sched.frontier`,
:mod:`streams_sched.connect`, :mod:`streams_sched.politeness` and
:mod:`streams_sched.scrapy_redis`.
"""
