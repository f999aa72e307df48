"""What long-running processes share: daemon plumbing, liveness, a /metrics endpoint.

It owns the loop, signals and logging of the daemons ``reclaimer`` and ``monitor``
(:mod:`.daemon`), whether a worker node is alive, dead or offline (:mod:`.liveness`)
and the Prometheus endpoint the worker and the daemons serve (:mod:`.metrics_server`).
It may import :mod:`streams_sched.connect`, :mod:`streams_sched.frontier` and the
top-level modules.
"""
