"""The Scrapy scheduler, at the path projects name in ``SCHEDULER``.

``SCHEDULER = "streams_sched.scheduler.StreamsScheduler"`` is the public path; the
scheduler lives in :mod:`streams_sched.worker.scheduler`.
"""

from streams_sched.worker.scheduler import StreamsScheduler

__all__ = ["StreamsScheduler"]
