"""The frontier in Redis: key names, the Lua scripts, and thin I/O for them.

It owns every key name (:mod:`.keys`), the server-side scripts in ``lua/`` with one
module each for their KEYS, ARGV and typed reply (:mod:`.scripts`), the client with one
method per script or command (:mod:`.client`) with the daemons' and the CLI's reads and
clean-up (:mod:`.reads`), what the calls take and give (:mod:`.records`), reply values
as text (:mod:`.replies`), the dedupe back-end (:mod:`.bloom`), the
daemons' read-only index scans (:mod:`.indexes`), what a site is (:mod:`.sitekey`), the
one path from a request to a queue entry (:mod:`.entries`), entries into enqueue.lua
calls (:mod:`.batches`) and the producer side, :class:`Seeder` (:mod:`.seeding`).
Decisions live elsewhere (pure modules in :mod:`streams_sched.worker` and :mod:`streams_sched.politeness`); this
package only names keys and moves bytes. It may import :mod:`streams_sched.wire`,
:mod:`streams_sched.connect` and the top-level modules, and scrapy-redis's fingerprint
and dupefilter check (:mod:`streams_sched.scrapy_redis.legacy`), which every entry of a
migrated crawl needs.
"""
