"""Reaching Redis: URLs, clients, and what a component checks of its server at start.

It owns the forms of ``REDIS_URL``, checked and masked (:mod:`.urls`), building clients
for a plain server, a cluster or a Sentinel service (:mod:`.clients`, the Sentinel
master's in :mod:`.sentinel`), waiting for Redis at start with back-off (:mod:`.waiting`),
the start-up checks of the server: eviction policy, modules, error replies
(:mod:`.server_checks`), a server that answers but refuses every write (:mod:`.writable`),
back-off while Redis is away (:mod:`.backoff`), and whether a
primary's writes are on a replica (:mod:`.replicas`: a pure judgement and one SET + WAIT
barrier, for the worker's acks and the Seeder). It may import only the top-level modules.
"""
