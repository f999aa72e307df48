"""The Grafana dashboard (compose/grafana/dashboards/streams-sched.json) against a real
Prometheus: every panel's PromQL, with the dashboard's variables filled in as Grafana
fills them, evaluates without error and returns data, while Prometheus scrapes a worker
crawling, the monitor and the reclaimer as compose/prometheus/prometheus.yml does; and
every label a legend names is a label of the series the query returns.

Some panels can only be empty in this scenario; EMPTY_HERE names each with the reason,
and the test fails if one of them returns data, so the list cannot go stale.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams_sched.testing import free_port

from daemons import Daemon, try_scrape
from helpers import ROOT, Worker, base_settings, read_items, wait_for
from prometheus import Prometheus

DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "streams-sched.json"
SCRAPE_CONFIG = ROOT / "compose" / "prometheus" / "prometheus.yml"
SITES, PAGES = 3, 60

#: (panel title, refId) -> why that query has no series while one plain worker crawls
EMPTY_HERE: dict[tuple[str, str], str] = {
    ("Browser leases per node (against its cap)", "A"):
        "the monitor exports browser leases per live worker with the browser capability, and this worker has none",
    ("Browser leases per node (against its cap)", "B"):
        "the cap too is exported per live worker with the browser capability only",
    ("Render time (p50, p95, mean)", "A"):
        "no browser task ran: the render histogram's rates are all 0, so the quantile is NaN",
    ("Render time (p50, p95, mean)", "B"):
        "no browser task ran: the render histogram's rates are all 0, so the quantile is NaN",
    ("Render time (p50, p95, mean)", "C"):
        "the monitor's render counters are per live worker with the browser capability only",
    ("Renders and failed renders per second", "A"):
        "the monitor's render counter is per live worker with the browser capability only",
    ("Redis memory against maxmemory", "B"):
        "the tests' redis-server has no maxmemory (0, which the query leaves out as no limit)",
    ("Revisits per second, and the share that found a change", "B"):
        "this crawl tracks no page, so no adaptive revisit compared a signature: the share is 0/0, NaN",
    ("Revisit demand (requests/s) and sites stretched to fit their rate", "B"):
        "no site has tracked pages that need more than its rate, so no stretch is above 1",
}

#: Grafana's own interval variables, as it would fill them for a 3-hour range
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "3h"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def fill(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$var``, ``${var}`` and ``[[var]]`` replaced; an unknown variable fails."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        known = {**BUILTINS, **values}
        assert name in known, f"the test does not know the dashboard variable ${name} (in {expr})"
        return known[name]

    return _VARIABLE.sub(one, expr)


def selections(dash: dict[str, Any], crawl: str) -> list[dict[str, str]]:
    """The variables' values as Grafana fills them: the "All" value (the dashboard's default), then the test's crawl."""
    variables = dash["templating"]["list"]
    assert [v["name"] for v in variables] == ["crawl"], "a new variable: give this test its values"
    (var,) = variables
    return [{"crawl": var["allValue"]}, {"crawl": re.escape(crawl)}]


def evaluate(prom: Prometheus, promql: str) -> list[dict[str, Any]]:
    """The instant vector ``promql`` evaluates to now; Prometheus's own error message if it refuses it."""
    url = f"http://127.0.0.1:{prom.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{promql}: {exc.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    assert body["data"]["resultType"] == "vector", (promql, body["data"]["resultType"])
    return body["data"]["result"]


def with_values(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The series that have a number to draw (Grafana draws nothing for NaN)."""
    return [s for s in result if not math.isnan(float(s["value"][1]))]


def _jobs() -> list[str]:
    return [job["job_name"] for job in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]]


@pytest.mark.e2e
def test_every_dashboard_panel_evaluates_and_has_data_on_a_real_crawl(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Every panel query of the Grafana dashboard runs on a real Prometheus scraping a worker, the monitor and the reclaimer, and returns data unless EMPTY_HERE says why it cannot."""
    dash = dashboard()
    ports = {"streams-monitor": free_port(), "streams-reclaimer": free_port(), "streams-worker": free_port()}
    assert sorted(_jobs()) == sorted(ports), "scrape the jobs compose/prometheus/prometheus.yml has"
    items = tmp_path / "items.jsonl"
    monitor = Daemon("monitor", ["--redis-url", plain_redis_url, "--metrics-port", str(ports["streams-monitor"]),
                                 "--interval", "0.5", "--cache-seconds", "0.5"], tmp_path / "monitor.log")
    reclaimer = Daemon("reclaimer", ["--redis-url", plain_redis_url, "--metrics-port", str(ports["streams-reclaimer"]),
                                     "--interval", "0.5"], tmp_path / "reclaimer.log")
    worker = None
    try:
        for job in ("streams-monitor", "streams-reclaimer"):
            port = ports[job]
            wait_for(lambda port=port: try_scrape(port) is not None, timeout=60, what=f"{job}'s /metrics")
        with Prometheus({job: [f"127.0.0.1:{port}"] for job, port in ports.items()}) as prom:
            # Prometheus is up first, so it scrapes the crawl while it runs (rates and the
            # lease-to-ack quantiles need counters that grew between two scrapes).
            # STREAMS_CLOSE_ON_DRAIN=False, as the Compose and Kubernetes workers run: the
            # worker stays up, and scraped, once the crawl is done.
            worker = Worker(base_settings(plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=SITES, SYNTH_PAGES=PAGES,
                                          SYNTH_SEED=True, SYNTH_DELAY_SECONDS=0.5, STREAMS_CLOSE_ON_DRAIN=False,
                                          STREAMS_METRICS_PORT=str(ports["streams-worker"])), tmp_path / "worker.log")
            pages = SITES * PAGES
            try:
                wait_for(lambda: len(read_items(items)) >= pages, timeout=120, what=f"{pages} pages")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; worker log:\n{worker.log()}") from None
            done = " and on() ".join([
                f'sum(streams_sched_acked_total{{crawl="{crawl}"}}) == {pages}',
                f'sum(streams_sched_worker_acked_total{{crawl="{crawl}"}}) == {pages}',
                f'sum(increase(streams_sched_worker_lease_to_ack_seconds_count{{crawl="{crawl}"}}[5m])) > 0',
                # three samples of each job's series, so that every rate has two
                f'min(count_over_time(streams_sched_workers_wanted{{crawl="{crawl}"}}[1m])) >= 3',
                f'min(count_over_time(streams_sched_reclaimer_requeued_total{{crawl="{crawl}"}}[1m])) >= 3',
                f'min(count_over_time(streams_sched_worker_acked_total{{crawl="{crawl}"}}[1m])) >= 3',
                "min(up) == 1",
            ])
            wait_for(lambda: evaluate(prom, done), timeout=60, what=f"Prometheus to have scraped the finished crawl: {done}")

            for var in dash["templating"]["list"]:  # label_values(METRIC, LABEL) offers the crawl
                metric, label = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["definition"]).groups()  # type: ignore[union-attr]
                offered = {s["metric"].get(label) for s in evaluate(prom, f"group by ({label}) ({metric})")}
                assert crawl in offered, (var["name"], offered)

            empty, has_data, bad_legends = set(), set(), []
            for panel in dash["panels"]:
                for t in panel["targets"]:
                    key = (panel["title"], t["refId"])
                    for values in selections(dash, crawl):
                        series = with_values(evaluate(prom, fill(t["expr"], values)))
                        if not series:
                            empty.add(key)
                            continue
                        has_data.add(key)
                        for name in re.findall(r"\{\{ *(\w+) *\}\}", t.get("legendFormat", "")):
                            if any(name not in s["metric"] for s in series):
                                bad_legends.append(f"{key}: legend names {{{{{name}}}}}, not a label of {t['expr']}")
            queries = [(p["title"], t["refId"]) for p in dash["panels"] for t in p["targets"]]
            assert len(set(queries)) == len(queries), "two panels share a title: name them apart"
            known = set(EMPTY_HERE)
            assert not known - set(queries), f"listed as empty here but not on the dashboard: {sorted(known - set(queries))}"
            assert not empty - known, f"panels without data: {sorted(empty - known)}"
            assert not known & has_data, f"listed as empty here but they have data: {sorted(known & has_data)}"
            assert has_data == set(queries) - known
            assert not bad_legends, bad_legends
    finally:
        if worker is not None:
            worker.close()
        reclaimer.close()
        monitor.close()
