"""How one setting's value is read and checked: the parsers and checks of the table in config.py.

A parser ``parse(name, raw)`` turns what Scrapy hands over (a Python value, or text from
``-s`` or the environment) into the field's value; a check ``check(name, value)``
refuses a value that parsed but is out of range. Both raise
:class:`~streams_sched.errors.ConfigError` naming the setting, its value and the fix.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import BANDS, MAX_SHARDS, TASK_TYPES

Check = Callable[[str, Any], None]

#: Band weights used for "strict": high always first, low only when nothing else.
STRICT_RATIO: tuple[int, int, int] = (1_000_000_000_000, 1_000_000, 1)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


# -- parsers ---------------------------------------------------------------------------


def as_is(name: str, value: Any) -> Any:
    """The value unchanged (its check says what is wrong with it)."""
    return value


def number(name: str, value: Any) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "expected a number") from None
    if isinstance(value, bool) or not math.isfinite(result):
        raise ConfigError(name, value, "expected a finite number")
    return result


def whole(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(name, value, "expected a whole number")
    try:
        result = int(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "expected a whole number") from None
    if isinstance(value, float) and value != result:
        raise ConfigError(name, value, "expected a whole number")
    return result


def flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, value, "expected True or False")


def env_flag(variable: str) -> bool:
    """An environment variable read as a flag: "1", "true", "yes", "on" are True, anything else False."""
    return os.environ.get(variable, "").strip().lower() in _TRUE


def text(name: str, value: Any) -> str:
    return str(value)


def keyword(name: str, value: Any) -> str:
    """A keyword setting, case-insensitive ("auto", "local", ...); its check names the choices."""
    return str(value).strip().lower()


def names(name: str, value: Any) -> tuple[Any, ...]:
    """A list, or a comma-separated string ("http,browser")."""
    if isinstance(value, str):
        return tuple(c.strip() for c in value.split(",") if c.strip())
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise ConfigError(name, value, 'expected a list, or names separated by commas ("a,b")')
    return tuple(value)


def json_dict(name: str, value: Any) -> Any:
    """A dict, or its JSON text ("" = empty); anything else is left for the check to name."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ConfigError(name, value, f"not valid JSON ({exc})") from None
    return dict(value) if isinstance(value, Mapping) else value


def min_replicas(name: str, value: Any) -> int:
    """"auto" (-1) or a number of replicas."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return -1
    n = whole(name, value)
    if n < 0:
        raise ConfigError(name, value, 'expected "auto" or a number of replicas (0 = do not wait for any)')
    return n


def parse_band_ratio(value: Any, setting: str = "STREAMS_BAND_RATIO") -> tuple[int, int, int]:
    """Parse "5:3:2" (or a 3-sequence, a {band: weight} dict, or "strict") into three
    positive weights."""
    if isinstance(value, str) and value.strip().lower() == "strict":
        return STRICT_RATIO
    parts: list[Any]
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(setting, value, f"is not valid JSON ({exc})") from None
    if isinstance(value, Mapping):
        unknown = [b for b in value if b not in BANDS]
        if unknown:
            raise ConfigError(setting, dict(value), f"unknown band(s) {unknown}; the bands are {list(BANDS)}")
        parts = [value.get(b, 1) for b in BANDS]
    elif isinstance(value, str):
        parts = value.split(":")
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ConfigError(setting, value, 'expected "high:default:low" weights like "8:3:1", or "strict"')
    try:
        weights = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(setting, value, "weights must be whole numbers, e.g. \"8:3:1\"") from None
    if len(weights) != len(BANDS) or any(w < 1 for w in weights):
        raise ConfigError(setting, value, "expected three weights of at least 1 (high:default:low)")
    return weights  # type: ignore[return-value]


def band_ratio(name: str, value: Any) -> tuple[int, int, int]:
    return parse_band_ratio(value, name)


#: scrapy-redis's default START_URLS_KEY.
DEFAULT_FEED_KEY = "%(name)s:start_urls"


def feed_key(name: str, value: Any) -> str:
    """A feed key template with ``%(name)s`` for the crawl name; True = scrapy-redis's, False or "" = none."""
    if value is False:
        return ""
    if value is True:
        value = DEFAULT_FEED_KEY
    if not isinstance(value, str):
        raise ConfigError(name, value, 'expected a key name like "%(name)s:start_urls", or "" for no feed')
    try:
        value.strip() % {"name": "crawl"}
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(name, value, f"only %(name)s may be substituted ({exc})") from None
    return value.strip()


def bind_address(name: str, value: Any) -> str:
    """An address to bind ("" = 0.0.0.0, every interface)."""
    return str(value or "0.0.0.0")


def ports(name: str, value: Any) -> tuple[int, ...]:
    """``9410`` or ``"9410-9419"``: the metrics ports to try, in order ("" = none)."""
    from streams_sched.worker.metrics import parse_ports

    return tuple(parse_ports(value, name))


# -- checks ----------------------------------------------------------------------------


def check_positive(name: str, value: float, zero_ok: bool = False) -> None:
    """A finite number above 0 (or 0 too with ``zero_ok``), else a ConfigError naming ``name``."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(name, value, "must be 0 or more" if zero_ok else "must be greater than 0")


def check_port(name: str, port: int) -> None:
    if not (0 <= port <= 65535):
        raise ConfigError(name, port, "expected a port (0-65535)")


def positive(name: str, value: Any) -> None:
    check_positive(name, value)


def positive_or_zero(name: str, value: Any) -> None:
    check_positive(name, value, zero_ok=True)


def check_whole(name: str, value: Any, minimum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(name, value, "expected a whole number")
    if minimum is not None and value < minimum:
        raise ConfigError(name, value, f"must be at least {minimum}")


def at_least(minimum: int) -> Check:
    """A whole number of at least ``minimum``."""

    def check(name: str, value: Any) -> None:
        check_whole(name, value, minimum)

    return check


def one_of(choices: Collection[str], problem: str | None = None) -> Check:
    """One of ``choices``; ``problem`` is the message (default: "expected one of (...)")."""

    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise ConfigError(name, value, problem or f"expected one of {tuple(choices)}")

    return check


def between_0_and_1(problem: str) -> Check:
    def check(name: str, value: Any) -> None:
        if not (0 < value < 1):
            raise ConfigError(name, value, problem)

    return check


def above_0_up_to_1(problem: str) -> Check:
    def check(name: str, value: Any) -> None:
        if not (0 < value <= 1):
            raise ConfigError(name, value, problem)

    return check


def above_1(problem: str) -> Check:
    def check(name: str, value: Any) -> None:
        if not (isinstance(value, (int, float)) and value > 1):
            raise ConfigError(name, value, problem)

    return check


def share(problem: str) -> Check:
    """A share from 0 (included) to 1 (excluded)."""

    def check(name: str, value: Any) -> None:
        if not (0 <= value < 1):
            raise ConfigError(name, value, problem)

    return check


def is_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "expected True or False")


def address(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ConfigError(name, value, "expected an address to bind, like 0.0.0.0 or 127.0.0.1")


def shards(name: str, value: Any) -> None:
    check_whole(name, value, 1)
    if value > MAX_SHARDS:
        raise ConfigError(name, value, f"at most {MAX_SHARDS} (a drain check reads every shard)")


def encoding(name: str, value: Any) -> None:
    try:
        "".encode(value)
    except LookupError:
        raise ConfigError(name, value, "unknown encoding") from None


def validate_node_id(node_id: str) -> bool:
    return 0 < len(node_id) <= 128 and all(c.isalnum() or c in "._:@-" for c in node_id)


def node_id(name: str, value: Any) -> None:
    if value and not validate_node_id(value):
        raise ConfigError(name, value, "use letters, digits and . _ : @ - (max 128)")


def capabilities(name: str, value: Any) -> None:
    bad = [c for c in value if c not in TASK_TYPES]
    if bad or not value:
        raise ConfigError(name, list(value), f"expected a non-empty subset of {list(TASK_TYPES)}")


def import_paths(name: str, value: Any) -> None:
    if not all(isinstance(c, str) for c in value):
        raise ConfigError(name, list(value), "expected a list of import paths")


def codec_paths(name: str, value: Any) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(name, value, "expected a dict of class import path -> codec import path")


def site_policies(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(name, value, "expected a dict of site -> policy dict")
    from streams_sched.politeness.policy import validate_policy

    for site, policy in value.items():
        validate_policy(site, policy)


def redis_url(name: str, value: Any) -> None:
    from streams_sched.connect.urls import validate_redis_url

    validate_redis_url(value, name)


def crawl_name(name: str, value: Any) -> None:
    from streams_sched.frontier.keys import validate_crawl_name

    validate_crawl_name(value, name)
