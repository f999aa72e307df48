"""Per-site politeness shared by every worker: policy, rates, back-off, Retry-After.

It owns validating and writing a site's policy (:mod:`.policy`), the pure parts of the
adaptive back-off and Crawl-delay (:mod:`.adaptive`), the last-minute rate read from a
site's ack buckets (:mod:`.rates`) and parsing ``Retry-After`` (:mod:`.retry_after`).
The enforcement itself runs in ``lease.lua`` and ``feedback.lua``. It may import
:mod:`streams_sched.frontier` (keys and the client, for writing policy) and the
top-level modules.
"""
