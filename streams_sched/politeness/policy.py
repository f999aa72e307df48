"""Per-site policy: validation (pure) and writing it to the site's policy hash.

A policy is a dict with any of::

    rate        requests per second for the whole crawl, all workers together (0 = no limit)
    burst       tokens the bucket holds (default: rate, at least 1)
    weight      share of a worker's fetches when several sites have work (default 1)
    task_type   "http" or "browser": the default task type of the site's requests
    max_browser most browser requests of this site in flight on one node
    paused      True to stop leasing the site (its backlog stays)
    max_pages   most requests of the site accepted in all (0 = no cap); more are dropped
                and counted (stats over_cap); requests with dont_filter are not counted
    revisit     track the site's pages: "1h", or "1h:adaptive,min=5m,max=7d" (units s, m,
                h, d; see :func:`parse_revisit`); a page takes it at its first visit and
                keeps it in its own meta from then on; "off" stops the tracking of every
                page of the site (``streams-sched revisits --stop``)

``STREAMS_SITES`` maps site names to policies; the key ``"*"`` is the default
for sites not listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import TASK_TYPES, validate_site_name

__all__ = [
    "POLICY_FIELDS",
    "apply_site_policies",
    "get_policy",
    "parse_revisit",
    "pause_site",
    "resume_site",
    "set_policy",
    "validate_policy",
]

POLICY_FIELDS: dict[str, type] = {
    "rate": float,
    "burst": float,
    "weight": float,
    "task_type": str,
    "max_browser": int,
    "paused": bool,
    "max_pages": int,
    "revisit": str,
}

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration_s(text: str) -> float:
    text = text.strip()
    unit = _UNITS.get(text[-1:], None)
    number = float(text[:-1] if unit else text)
    if number <= 0:
        raise ValueError(f"{text!r} is not above 0")
    return number * (unit or 1.0)


def parse_revisit(text: str) -> dict[str, Any]:
    """A policy's ``revisit`` as ``meta["revisit"]`` takes it: ``"1h"`` -> {"every": 3600},
    ``"1h:adaptive,min=5m,max=7d"`` -> every, adaptive, min and max. Raises ValueError."""
    every, _, options = text.partition(":")
    try:
        out: dict[str, Any] = {"every": _duration_s(every)}
        for option in filter(None, (o.strip() for o in options.split(","))):
            name, eq, value = option.partition("=")
            if name == "adaptive" and not eq:
                out["adaptive"] = True
            elif name in ("min", "max") and eq:
                out[name] = _duration_s(value)
            else:
                raise ValueError(f"unknown option {option!r}")
    except ValueError as exc:
        raise ValueError(f"expected an interval like '1h' or '1h:adaptive,min=5m,max=7d' ({exc})") from None
    if out.get("min", 0) > out.get("max", float("inf")):
        raise ValueError("min is above max")
    return out


def validate_policy(site: str, policy: Mapping[str, Any], setting: str = "STREAMS_SITES") -> dict[str, str]:
    """Check one site's policy; return it as the string fields stored in Redis."""
    name = f"{setting}[{site!r}]"
    if site != "*":
        try:
            validate_site_name(site)
        except ValueError as exc:
            raise ConfigError(setting, site, str(exc)) from None
    if not isinstance(policy, Mapping):
        raise ConfigError(name, policy, "expected a dict like {'rate': 5, 'burst': 10, 'weight': 2}")
    out: dict[str, str] = {}
    for key, value in policy.items():
        kind = POLICY_FIELDS.get(key)
        if kind is None:
            raise ConfigError(name, dict(policy), f"unknown policy field {key!r}; known: {sorted(POLICY_FIELDS)}")
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{name}[{key!r}]", value, "expected True or False")
            out[key] = "1" if value else "0"
        elif key == "revisit":
            if site == "*":
                raise ConfigError(f"{name}[{key!r}]", value, "track every page of a crawl with STREAMS_REVISIT_EVERY_SECONDS")
            try:
                if value != "off":
                    parse_revisit(str(value))
            except ValueError as exc:
                raise ConfigError(f"{name}[{key!r}]", value, str(exc)) from None
            out[key] = str(value)
        elif kind is str:
            if value not in TASK_TYPES:
                raise ConfigError(f"{name}[{key!r}]", value, f"expected one of {list(TASK_TYPES)}")
            out[key] = value
        else:
            try:
                number = kind(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{name}[{key!r}]", value, "expected a number") from None
            if isinstance(value, bool) or number < 0:
                raise ConfigError(f"{name}[{key!r}]", value, "expected a number of 0 or more")
            if key == "max_pages" and site == "*":
                raise ConfigError(f"{name}[{key!r}]", value, "a page cap is per site; set it on each site, not on '*'")
            if key == "weight" and number == 0:
                raise ConfigError(f"{name}[{key!r}]", value, "a weight must be above 0 (pause the site instead)")
            out[key] = repr(number) if kind is float else str(number)
    return out


def apply_site_policies(frontier: Any, sites: Mapping[str, Mapping[str, Any]]) -> None:
    """Write every listed site's policy to Redis (the default "*" goes to the crawl meta)."""
    pipe = frontier.client.pipeline(transaction=False)
    for site, policy in sites.items():
        fields = validate_policy(site, policy)
        if not fields:
            continue
        if site == "*":
            pipe.hset(frontier.keys.meta, mapping={f"default_{k}": v for k, v in fields.items()})
        else:
            # registered first: enqueue.lua reads no policy of a site missing from its registry
            frontier.register_sites([site], pipe)
            pipe.hset(frontier.site(site).policy, mapping=fields)
    pipe.execute()


def set_policy(frontier: Any, site: str, policy: Mapping[str, Any]) -> dict[str, str]:
    """Validate and store a site's policy fields (``"*"``: the crawl's default). Workers
    see the change on their next lease of that site."""
    fields = validate_policy(site, policy, setting="policy")
    if fields:
        if site == "*":
            frontier.client.hset(frontier.keys.meta, mapping={f"default_{k}": v for k, v in fields.items()})
        else:
            frontier.register_sites([site])  # first: see apply_site_policies
            frontier.client.hset(frontier.site(site).policy, mapping=fields)
    return fields


def get_policy(frontier: Any, site: str) -> dict[str, str]:
    """A site's stored policy fields (without the token-bucket state)."""
    if site == "*":
        raw = frontier.client.hgetall(frontier.keys.meta)
        prefix = "default_"
        return {
            k.decode()[len(prefix):]: v.decode()
            for k, v in raw.items()
            if k.decode().startswith(prefix)
        }
    raw = frontier.client.hgetall(frontier.site(site).policy)
    return {k.decode(): v.decode() for k, v in raw.items() if k.decode() in POLICY_FIELDS}


def pause_site(frontier: Any, site: str) -> None:
    """Stop leasing a site; its backlog, leases and delayed requests stay."""
    set_policy(frontier, site, {"paused": True})


def resume_site(frontier: Any, site: str) -> None:
    set_policy(frontier, site, {"paused": False})
