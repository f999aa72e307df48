"""Operator tools on a crawl: dead letters, tracked pages, ACL users, rights.

It owns reading and re-queueing dead letters (:mod:`.dlq`), listing and stopping tracked
pages (:mod:`.revisits`), the minimal ACL rules of
each role (:mod:`.acl`) and checking at start that a user may run its role's commands
(:mod:`.rights`).
The command line in :mod:`streams_sched.cli` and the daemons call it. It may import
:mod:`streams_sched.frontier`, :mod:`streams_sched.connect` and the top-level modules;
the import rules of every subpackage are checked by ``tests/test_layout.py``.
"""
