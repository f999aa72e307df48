"""The spider zoo: ordinary Scrapy spiders of every kind, a local site and the harness (tests/test_zoo.py)."""
