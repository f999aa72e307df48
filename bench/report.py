"""Turn the measurements of one run into markdown tables (stdout, bench/results/, README)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["median_runs", "render"]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        if abs(v) >= 0.01:
            return f"{v:.2f}"
        return f"{v:.4f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field over repeated runs of one config; spread of pages/s."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    rates = [r["pages_per_s"] for r in runs]
    out["runs"] = len(runs)
    out["pages_per_s_min"] = min(rates)
    out["pages_per_s_max"] = max(rates)
    out["all_pages_per_s"] = rates
    out["complete"] = all(r["missing"] == 0 for r in runs)
    return out


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


def _paired(r: dict[str, Any], base: str, data: dict[str, Any]) -> str:
    """Median of the per-round ratios (falls back to the ratio of medians)."""
    value = r.get(f"paired_vs_{base}")
    if value is None:
        return _ratio(r["pages_per_s"], data.get(base, {}).get("pages_per_s"))
    return f"{value:.2f}x"


def _spread(r: dict[str, Any]) -> str:
    return f"{r['pages_per_s']:.0f} ({r['pages_per_s_min']:.0f}-{r['pages_per_s_max']:.0f})"


def render(res: dict[str, Any]) -> str:
    cfg = res["config"]
    out: list[str] = []
    m = res["machine"]
    out.append(
        f"Machine: {m['cores']} cores, {m['cpu']}, Python {m['python']}, Redis {m['redis']},"
        f" Scrapy {m['scrapy']}, scrapy-redis {m['scrapy_redis']}, redis-py {m['redis_py']}"
        f" (hiredis {m['hiredis']}), load average at start {m['load']}."
    )
    out.append(f"Command: `{cfg['command']}`")
    a = res.get("a")
    if a:
        out.append(
            f"\n### (a) One worker: {cfg['sites']} sites x {cfg['pages']:,} pages, CONCURRENT_ITEMS = 8,"
            f" median of {cfg['repeat']} (min-max)\n"
        )
        rows = []
        for kind, r in a.items():
            rows.append([
                kind, _spread(r), _paired(r, "scrapy-redis", a), _paired(r, "memory", a),
                r["worker_cpu_ms_per_page"], r["reactor_run_ms_per_page"], r["pump_run_ms_per_page"],
                r["reactor_blocked_ms_per_page"], r["reactor_runqueue_ms_per_page"],
                r.get("redis_cpu_ms_per_page", 0.0), r["round_trips_per_page"],
                "yes" if r["complete"] else "NO", r["repeats"],
            ])
        out.append(table(
            ["scheduler", "pages/s", "vs scrapy-redis", "vs memory", "worker CPU ms/page",
             "reactor thread on CPU", "I/O thread on CPU", "reactor blocked", "reactor waiting for a CPU",
             "Redis CPU ms/page", "round trips/page", "all pages", "repeats"],
            rows,
        ))
        out.append(
            "\nRatios are medians of per-round ratios (each run against the baseline run of the same"
            " round). Per-thread columns are ms per page from /proc/self/task/*/schedstat: on a CPU;"
            " blocked (GIL, sockets, idle event loop); runnable but waiting for a CPU, i.e. other"
            " processes on this machine (the noise indicator)."
        )
    b = res.get("b")
    if b:
        out.append(f"\n### (b) Two workers on one crawl (pre-seeded with pages 0-{cfg['preseed_pages'] - 1} of every site), median of {cfg['repeat']}\n")
        rows = []
        for kind, r in b.items():
            one = (a or {}).get(kind, {}).get("pages_per_s")
            rows.append([
                kind, _spread(r), _paired(r, "scrapy-redis", b), _ratio(r["pages_per_s"], one),
                r["worker_cpu_ms_per_page"], r.get("redis_cpu_ms_per_page", 0.0),
                r["round_trips_per_page"], "/".join(str(int(x)) for x in r["per_worker_pages"]),
                "yes" if r["complete"] else "NO", r["repeats"],
            ])
        out.append(table(
            ["scheduler", "pages/s", "vs scrapy-redis", "vs 1 worker", "worker CPU ms/page",
             "Redis CPU ms/page", "round trips/page", "pages per worker", "all pages", "repeats"],
            rows,
        ))
    c = res.get("c")
    if c:
        out.append(
            f"\n### (c) Raw frontier operations, {c['n']:,} requests over 10 sites"
            f" (one PING round trip: {c['ping_round_trip_us']:.0f} us)\n"
        )
        sr_e, sr_p = c["scrapy_redis_enqueue"], c["scrapy_redis_pop"]
        out.append(table(
            ["operation", "per second", "vs scrapy-redis"],
            [
                [f"streams-sched enqueue + dedupe, RedisBloom ({c['enqueue_batch_per_site']}/site/script, 1 pipeline per cycle)",
                 c["streams_enqueue_bf"], _ratio(c["streams_enqueue_bf"], sr_e)],
                ["streams-sched enqueue + dedupe, bitmap Bloom (Lua)", c["streams_enqueue_bitmap"], _ratio(c["streams_enqueue_bitmap"], sr_e)],
                ["scrapy-redis enqueue: SADD (+ ZADD if new), 1 round trip each", sr_e, "1.00x"],
                [f"streams-sched lease + ack ({c['lease_batch_per_site']}/site/script, acks ride the next lease pipeline)",
                 c["streams_lease_ack"], _ratio(c["streams_lease_ack"], sr_p)],
                ["scrapy-redis pop: MULTI ZRANGE ZREMRANGEBYRANK EXEC (no ack)", sr_p, "1.00x"],
            ],
        ))
        out.append("\nHalf of every enqueue batch are fingerprints already in the filter.")
    d = res.get("d")
    if d:
        out.append("\n### (d) Redis memory per seen fingerprint (Bloom at error 0.001, capacity = N)\n")
        rows = []
        sets = {r["n"]: r for r in d if r["kind"] == "set"}
        names = {"bf": "RedisBloom BF", "bitmap": "bitmap Bloom (enqueue.lua)", "set": "SET of 40-hex (scrapy-redis)"}
        for r in d:
            s = sets.get(r["n"])
            rows.append([
                f"{r['n']:,}", names[r["kind"]], r["bytes_per_fp"], r["used_bytes_per_fp"],
                f"1/{s['bytes_per_fp'] / r['bytes_per_fp']:.1f}" if s else "-",
                f"{100 * r['false_positive_rate']:.3f}%", r["layers"], r["fill_s"],
            ])
        out.append(table(
            ["fingerprints", "structure", "bytes/fp (MEMORY USAGE)", "bytes/fp (used_memory)",
             "of the SET", "false positives", "layers", "fill s"],
            rows,
        ))
    e = res.get("e")
    if e:
        out.append("\n### (e) Codec cost per request (encode + decode, median)\n")
        base = {r["request"]: r["total_us"] for r in e if r["codec"] == "msgpack"}
        out.append(table(
            ["request", "codec", "bytes", "encode us", "decode us", "total us", "vs msgpack"],
            [[r["request"], r["codec"], r["bytes"], r["encode_us"], r["decode_us"], r["total_us"],
              _ratio(r["total_us"], base[r["request"]])] for r in e],
        ))
    if a or b:
        out.append("\n### (f) Redis round trips per crawled page (client-side count; a pipeline = 1)\n")
        rows = []
        for section, data in (("1 worker", a or {}), ("2 workers", b or {})):
            for kind, r in data.items():
                if kind == "memory":
                    continue
                top = ", ".join(f"{k} {v / max(r['pages'], 1):.2f}" for k, v in list(r.get("redis_calls", {}).items())[:4])
                rows.append([section, kind, r["round_trips_per_page"], r["round_trips_reactor_per_page"], r.get("redis_calls_per_page", 0.0), top])
        out.append(table(["workers", "scheduler", "round trips/page", "from the reactor thread", "Redis cmds/page", "top commands per page (server side, incl. inside Lua)"], rows))
    out.append("\n### Targets\n")
    out.append(table(["target", "measured", "met"], targets(res)))
    return "\n".join(out) + "\n"


def targets(res: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []

    def check(name: str, value: float | None, goal: float, fmt: str, higher: bool = True) -> None:
        if value is None:
            rows.append([name, "not measured", "-"])
            return
        ok = value >= goal if higher else value <= goal
        rows.append([name, fmt.format(value), "yes" if ok else "NO"])

    a, b, d = res.get("a") or {}, res.get("b") or {}, res.get("d") or []
    ss, ss2 = a.get("streams-sched") or {}, b.get("streams-sched") or {}
    check("(a) streams-sched >= 2.0x scrapy-redis pages/s", ss.get("paired_vs_scrapy-redis"), 2.0, "{:.2f}x")
    check("(a) streams-sched >= 0.9x in-memory pages/s", ss.get("paired_vs_memory"), 0.9, "{:.2f}x")
    check("(b) two workers: streams-sched >= 1.5x scrapy-redis", ss2.get("paired_vs_scrapy-redis"), 1.5, "{:.2f}x")
    for n in sorted({r["n"] for r in d}):
        bytes_ = {r["kind"]: r["bytes_per_fp"] for r in d if r["n"] == n}
        for kind, label in (("bf", "RedisBloom"), ("bitmap", "bitmap")):
            if kind in bytes_ and "set" in bytes_:
                check(f"(d) {label} <= 1/20 of the SET at {n:,}", bytes_[kind] / bytes_["set"], 1 / 20,
                      "1/{:.1f}".format(bytes_["set"] / bytes_[kind]) if bytes_[kind] else "0", higher=False)
    for label, data in (("1 worker", a), ("2 workers", b)):
        r = data.get("streams-sched")
        check(f"(f) streams-sched <= 1.5 round trips per page ({label})",
              r["round_trips_per_page"] if r else None, 1.5, "{:.3f}", higher=False)
    return rows
