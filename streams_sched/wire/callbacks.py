"""One rule to name a spider's callbacks and errbacks, and to find them again.

A callback travels through the shared queue as the name of an attribute of
the spider. The rule, used both ways (``method_name`` on encode,
``spider_method`` on decode):

    a name is valid for ``spider`` when it is an identifier, not a dunder
    (``__x__``), and ``getattr(spider, name)`` is a bound method whose
    ``__self__`` is that very spider.

That admits what Scrapy's ``Request.to_dict(spider=...)`` names for the
spider's own methods: public ones, private ones (CrawlSpider's ``_callback``
and ``_errback``, SitemapSpider's ``_parse_sitemap``), name-mangled ones
(``_Spider__parse``), methods from mixins and functions assigned as class
attributes. It refuses what is not the spider's own method: a lambda, a plain
function, a method bound to another object kept in a spider attribute
(Scrapy's "delegated" callbacks: wrap those in a spider method), a classmethod,
dunders, and non-callables. Nothing is imported: a name is only looked up on
the spider. A producer without the spider (the Seeder, the CLI) checks a name
with ``check_name``; the worker that decodes the entry applies the rest.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import MethodType
from typing import Any

__all__ = ["check_name", "method_name", "spider_method"]


def _valid_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not (name.startswith("__") and name.endswith("__"))
    )


def check_name(name: object) -> str:
    """Return ``name`` if the rule admits it as a method name (before any spider is at
    hand: a seeder names callbacks the workers look up); ValueError if not."""
    if not _valid_name(name):
        raise ValueError(f"{name!r} is not a method name (identifiers only, no dunders)")
    assert isinstance(name, str)
    return name


def spider_method(spider: object, name: object) -> MethodType:
    """Return the bound method ``name`` of ``spider``; ValueError with the reason if the
    rule refuses it."""
    name = check_name(name)
    try:
        method = getattr(spider, name)
    except Exception as exc:
        raise ValueError(f"the spider has no attribute {name!r} ({type(exc).__name__})") from None
    if not inspect.ismethod(method):
        what = "not callable" if not callable(method) else f"a {type(method).__name__}, not a bound method"
        raise ValueError(f"attribute {name!r} of the spider is {what}")
    if method.__self__ is not spider:
        raise ValueError(
            f"attribute {name!r} is a method of {type(method.__self__).__name__}, not of the spider"
        )
    return method


def _candidate_names(spider: object) -> Iterator[str]:
    seen: set[str] = set()
    for namespace in (getattr(spider, "__dict__", {}), *(vars(k) for k in type(spider).__mro__)):
        for name in namespace:
            if name not in seen:
                seen.add(name)
                yield name


def method_name(spider: object, func: Callable[..., Any]) -> str:
    """Return a name under which ``spider_method(spider, name)`` gives back ``func``;
    ValueError with the reason (and the fix) if there is none."""
    if spider is None:
        raise ValueError(f"{func!r} cannot be named without a spider")
    if not inspect.ismethod(func) or func.__self__ is not spider:
        raise ValueError(
            f"{func!r} is not a method of the spider; only the spider's own methods can travel"
            " through the shared queue (by name): define a spider method that calls it"
        )
    target = func.__func__
    first = func.__name__
    for name in (first, *_candidate_names(spider)):
        try:
            found = spider_method(spider, name)
        except ValueError:
            continue
        if found.__func__ is target:
            return name
    raise ValueError(f"spider method {func.__name__!r} is not reachable under any attribute name")
