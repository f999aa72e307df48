"""The worker's I/O thread: every Redis round trip of a worker happens here.

:mod:`.cycle` holds the thread and its cycle, and reads top to bottom: take the
reactor's operations, send enqueues, acks, feedback, leases and the heartbeat in one
pipeline, read the replies, hold acks behind replicas, upkeep. The parts it calls each
own their state: :mod:`.leasing` (lease calls and what their replies teach),
:mod:`.barrier` (acks wait until a request's follow-ups are on a replica, deciding with
:mod:`streams_sched.connect.replicas`), :mod:`.takeover` (expired leases),
:mod:`.drain_check` (is the crawl drained in Redis), :mod:`.feeding` (a scrapy-redis
feed), :mod:`.presence` (the heartbeat), :mod:`.trouble` and :mod:`.refusals` (outages
and refusals) and :mod:`.recovery` (handing back leases whose reply was lost);
:mod:`.sent` records what each pipelined command was. It talks to the reactor thread
only through :class:`streams_sched.worker.exchange.Exchange`, and to Redis only through
:class:`streams_sched.frontier.client.Frontier` and the replica barrier. It may import
the reactor side's shared objects under :mod:`streams_sched.worker` (exchange, ops,
leasebook, selection, drain), :mod:`streams_sched.wire`, :mod:`streams_sched.frontier`,
:mod:`streams_sched.connect`, :mod:`streams_sched.politeness` and
:mod:`streams_sched.scrapy_redis`.
"""
