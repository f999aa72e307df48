"""The frontier as data: a crawl to a file and back into any Redis, and where a URL is.

It owns the dump format and the tools that read and write it; it uses the frontier's
scripts (read_site.lua, freeze_site.lua, enqueue.lua's 'load' keys) and the one path
from a request to an entry (frontier/entries.py), and imports nothing of the worker.

Layout: :mod:`.jsonvalues` (msgpack values as JSON, exactly), :mod:`.records` (the lines
of a dump and url-frontier's, pure), :mod:`.inputs` (a file's numbered lines, gzip, what
ends a file early), :mod:`.sitereader` (one site at one point in time, streamed),
:mod:`.journal` (what is added to a shard while a dump reads it), :mod:`.dump` (the
Dumper), :mod:`.load` (the Loader: a file through enqueue.lua, each line once),
:mod:`.finding` (where a URL is, and why), :mod:`.progress` (a progress bar on a terminal).
"""
