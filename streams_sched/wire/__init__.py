"""The wire format: how a Scrapy request becomes a stream entry and back, without pickle.

It owns the layout of a payload and its schema versions (:mod:`.schema`), the msgpack
codec of a request (:mod:`.codec`) and of many seed URLs at once (:mod:`.url_template`),
the typed values of meta, cb_kwargs and cookies (:mod:`.values`, with dates and times in
:mod:`.times` and objects by class name in :mod:`.objects`), the registry of project codecs
(:mod:`.meta_codecs`) and the one rule that names a callback and finds it again on
the spider (:mod:`.callbacks`). Nothing read from an entry is evaluated or imported.
It is pure: no Redis, no threads. It may import Scrapy and the top-level modules
(:mod:`streams_sched.errors`, :mod:`streams_sched.config`) only.
"""
