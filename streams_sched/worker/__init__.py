"""The worker, on Scrapy's side: everything that runs on the reactor thread.

It owns the Scrapy scheduler (:mod:`.scheduler`), the ready sites in weighted-fair
order (:mod:`.fairness`), what the worker holds (:mod:`.leasebook`), requests that stay
local (:mod:`.unserializable`), the hooks into Scrapy's engine (:mod:`.engine`), the
worker's metrics, and the two objects the reactor thread shares with the I/O thread:
the :mod:`.exchange` and the :mod:`.ops` it queues. Every Redis round trip happens on the
I/O thread in :mod:`streams_sched.worker.io`; nothing here waits on a socket. It may
import :mod:`streams_sched.wire`, :mod:`streams_sched.frontier` (names and pure helpers,
not its client), :mod:`streams_sched.politeness` and the top-level modules.
"""
