"""The worker, on Scrapy's side: everything that runs on the reactor thread.

It owns the Scrapy scheduler (:mod:`.scheduler`) and its parts: the ready requests per
site in weighted-fair order (:mod:`.ready`, :mod:`.fairness`), what each answer tells
the cluster (:mod:`.answers`), what this worker already sent (:mod:`.dedupe`), the
handout per event-loop turn (:mod:`.turns`), start-up (:mod:`.opening`) and hand-back at
close (:mod:`.handback`); what the worker holds (:mod:`.leasebook`), requests that stay
local (:mod:`.unserializable`), the hooks into Scrapy's engine (:mod:`.engine`), the
worker's metrics, and the two objects the reactor thread shares with the I/O thread:
the :mod:`.exchange` and the :mod:`.ops` it queues. Every Redis round trip happens on
the I/O thread in :mod:`streams_sched.worker.io`; nothing here waits on a socket,
except :mod:`.opening`, once, before the crawl starts (and, while Redis refuses the
start's writes, :mod:`.start_wait` on a thread of its own). It may import
any subpackage but the command line and the demo: it is the top of the worker's side.
"""
