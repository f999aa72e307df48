"""Operator tools on a crawl: dead letters, ACL users, rights, layout upgrades.

It owns reading and re-queueing dead letters (:mod:`.dlq`), the minimal ACL rules of
each role (:mod:`.acl`), checking at start that a user may run its role's commands
(:mod:`.rights`) and moving an older key layout to the sharded one (:mod:`.upgrade`, its pure
planning in :mod:`.upgrade_plan`).
The command line in :mod:`streams_sched.cli` and the daemons call it. It may import
:mod:`streams_sched.frontier`, :mod:`streams_sched.connect`, :mod:`streams_sched.service`
(liveness, to refuse an upgrade while workers run) and the top-level modules; the import
rules of every subpackage are checked by ``tests/test_layout.py``.
"""
