"""Seed a crawl from any program: a web app, an Airflow task, a cron job.

::

    from streams_sched import Seeder

    with Seeder("redis://localhost:6379/0", crawl="books") as seeder:
        result = seeder.seed(["https://example.com/"], priority=5, callback="parse_list")
    result.added, result.duplicates      # the URLs of each kind

Seeds go through the same atomic enqueue as the workers' requests: fingerprinted
with Scrapy's own fingerprinter (pass the crawl's, e.g. ``crawler.request_fingerprinter``,
if the project changes REQUEST_FINGERPRINTER_CLASS), deduped by the site's Bloom filter
(and by a migrated scrapy-redis dupefilter, see :mod:`streams_sched.scrapy_redis.legacy`), and
routed by the site's policy: a seed that names no ``meta["task_type"]`` lands in the
browser streams of a site whose ``task_type`` is ``browser``.

Speed, for a frontier of millions of one-URL sites:

- Every request becomes its entry on the one path of frontier/entries.py. A URL given
  as a string, with Scrapy's default fingerprinter, takes its faster twin there
  (``url_entries``) that builds no Request and gives the same entry: the URL Scrapy's
  Request would hold, the default fingerprint of it and the payload are computed
  directly (the payload's fields after the URL are packed once per call). Any other
  fingerprinter, a migrated scrapy-redis dupefilter, ``meta["verbatim_url"]`` or
  ``meta["not_before"]`` takes the Request path.
- A batch is one enqueue.lua call per shard. Calls go out on one connection per
  primary, and the next batch is sent before the replies of the previous one are
  read: Redis works on one batch while this process prepares the next.

Layout: :mod:`.seeder` (the :class:`Seeder`: input to entries, batches), :mod:`.send`
(a batch's calls written, their replies read, replicas waited for), :mod:`.packing`
(the calls packed as Redis protocol) and :mod:`.wire` (a connection per primary).
"""

from __future__ import annotations

from streams_sched.frontier.keys import SITE_TASK
from streams_sched.frontier.seeding.seeder import Seed, Seeder, seed
from streams_sched.frontier.seeding.send import SeedResult

__all__ = ["SITE_TASK", "Seed", "SeedResult", "Seeder", "seed"]
