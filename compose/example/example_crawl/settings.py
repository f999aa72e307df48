"""Settings of the example project: the two streams-sched settings, plus the
synthetic web (served by a download handler, no network needed) and the
worker metrics port. Everything can be overridden from the environment."""

import os

BOT_NAME = "example_crawl"
SPIDER_MODULES = ["example_crawl.spiders"]

# the two settings that turn streams-sched on
SCHEDULER = "streams_sched.scheduler.StreamsScheduler"
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

STREAMS_PREFIX = os.environ.get("STREAMS_PREFIX", "example")
STREAMS_CLOSE_ON_DRAIN = False  # stay up and wait for new seeds, like a service
STREAMS_LEASE_SECONDS = float(os.environ.get("STREAMS_LEASE_SECONDS", "60"))
STREAMS_METRICS_PORT = os.environ.get("STREAMS_METRICS_PORT", "9410-9419")

DOWNLOAD_HANDLERS = {"http": "streams_sched.demo.handler.SyntheticHandler"}
SYNTH_SITES = int(os.environ.get("SYNTH_SITES", "20"))
SYNTH_PAGES = int(os.environ.get("SYNTH_PAGES", "1000"))
SYNTH_DELAY_SECONDS = float(os.environ.get("SYNTH_DELAY_SECONDS", "0.05"))

CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 8
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
