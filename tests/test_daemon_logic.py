"""Pure logic of the daemons, the metrics and the CLI: no Redis, no processes."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from urllib.parse import parse_qs, unquote_plus, urlparse

import pytest

from monitor.alerts import FIRING, RESOLVED, RUNNING_WINDOW_S, AlertRules, Debouncer
from monitor.exporter import OTHER, SiteLabeller, build_families, build_server_families, metric_names
from monitor.settings import MonitorSettings
from monitor.snapshot import CrawlSnapshot, bitmap_items
from monitor.state import AlertState
from monitor.webhook import render, signed_url
from reclaimer.logic import crawl_limits, nodes_to_forget, prune_candidates
from reclaimer.settings import ReclaimerSettings
from streams_sched.cli.status import Progress, progress_line
from streams_sched.connect.server_checks import ServerMemory
from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import STREAMS
from streams_sched.frontier.records import SiteStatus, StreamStatus
from streams_sched.politeness.rates import ack_rate_per_s, acks_last_minute
from streams_sched.service.liveness import ALIVE, DEAD, OFFLINE, classify, node_states
from streams_sched.worker.metrics import parse_ports


def site(name: str, backlog: tuple[int, int, int] = (0, 0, 0), pending: int = 0, oldest_ms: int = -1,
         delayed: int = 0, dead: int = 0, stats: dict[str, int] | None = None, paused: bool = False) -> SiteStatus:
    streams = {key: StreamStatus(0, 0, -1) for key in STREAMS}
    for i, band in enumerate(("high", "default", "low")):
        streams[("http", band)] = StreamStatus(backlog[i], 0, -1)
    streams[("http", "default")] = StreamStatus(backlog[1], pending, oldest_ms)
    return SiteStatus(name, 0, streams, delayed, -1, dead, stats or {}, {"paused": "1"} if paused else {})


# -- rates ------------------------------------------------------------------------


def test_rate_counts_only_the_buckets_of_the_last_minute() -> None:
    """Acks in the 10-second buckets of the last minute count; older buckets do not."""
    stats = {"ack_b": 100, "ack4": 6, "ack3": 3, "ack2": 1, "ack1": 50}  # ack1 = bucket 97... or 103
    assert acks_last_minute(stats, 100 * 10_000 + 5_000) == (6 + 3 + 1 + 50, 55.0)
    assert acks_last_minute(stats, 103 * 10_000) == (6 + 3 + 1, 50.0)  # 97 is out of the window
    assert acks_last_minute(stats, 106 * 10_000)[0] == 0
    assert ack_rate_per_s({}, 123) == 0.0
    assert ack_rate_per_s({"ack_b": 10, "ack4": 60}, 10 * 10_000) == pytest.approx(60 / 50)


# -- liveness ---------------------------------------------------------------------


def test_node_silent_for_three_heartbeats_is_dead() -> None:
    """A node is alive within 3 heartbeats of its last record, dead after, offline when it said so."""
    rec = {"last_seen": 1000.0, "heartbeat_s": 2, "state": "online"}
    assert classify("n", rec, 1005.9).state == ALIVE
    assert classify("n", rec, 1006.1).state == DEAD
    assert classify("n", {**rec, "state": "offline"}, 5000).state == OFFLINE


def test_fresh_event_beats_a_stale_record() -> None:
    """A heartbeat heard on pub/sub keeps a node alive even if its record (or clock) is stale."""
    rec = {"last_seen": 0.0, "heartbeat_s": 5, "state": "online"}
    assert classify("n", rec, 1000.0, heard=(1.0, "heartbeat")).state == ALIVE
    assert classify("n", rec, 1000.0, heard=(1.0, "node_offline")).state == OFFLINE
    states = node_states({}, 1000.0, {"only-heard": (100.0, "heartbeat")})
    assert states["only-heard"].state == DEAD and states["only-heard"].heartbeat_s == 5.0


# -- reclaimer decisions ------------------------------------------------------------


def test_lease_and_limit_come_from_the_workers_unless_set() -> None:
    """The longest lease and largest limit of the live workers apply, else of any record; a setting wins."""
    nodes = {"a": {"lease_s": 60, "max_deliveries": 3}, "b": {"lease_s": 120}, "c": {}}
    assert crawl_limits(nodes, None, None, 300, 5) == (120, 3)
    assert crawl_limits(nodes, None, None, 300, 5, alive=["a", "c"]) == (60, 3)
    assert crawl_limits(nodes, None, None, 300, 5, alive=["c"]) == (120, 3)  # no live one says
    assert crawl_limits({}, None, None, 300, 5) == (300, 5)
    assert crawl_limits(nodes, 10, 9, 300, 5) == (10, 9)


def test_prune_spares_owners_live_nodes_and_recent_consumers() -> None:
    """Only idle consumers without pending entries that are not live nodes are candidates."""
    states = node_states({"live": {"last_seen": 100, "heartbeat_s": 5}, "gone": {"last_seen": 0, "heartbeat_s": 5}}, 101)
    rows = [(0, "live", 0, 99_000), (0, "gone", 0, 99_000), (1, "gone", 2, 99_000), (2, "fresh", 0, 10), (3, "unknown", 0, 99_000)]
    assert prune_candidates(rows, states, 15_000) == [(0, "gone"), (3, "unknown")]
    assert prune_candidates(rows, states, 15_000, keep=["unknown"]) == [(0, "gone")]


def test_nodes_are_forgotten_only_when_long_gone_and_owning_nothing() -> None:
    """Dead or offline node records older than the retention go, unless they own pending entries."""
    states = node_states(
        {"old": {"last_seen": 0}, "owner": {"last_seen": 0}, "live": {"last_seen": 9990}, "recent": {"last_seen": 9000}},
        10_000,
    )
    assert nodes_to_forget(states, {"owner"}, 3600) == ["old"]
    assert nodes_to_forget(states, set(), 0) == []


# -- alerts ---------------------------------------------------------------------------


def snap(crawl: str = "c", sites: list[SiteStatus] | None = None) -> CrawlSnapshot:
    return CrawlSnapshot(crawl, 0.0, sites or [])


def test_backlog_alert_fires_once_until_it_clears() -> None:
    """A backlog over the threshold fires one alert, nothing while it holds, one resolved when it clears."""
    rules, deb = AlertRules(backlog_threshold=100), Debouncer()
    high = [snap(sites=[site("a.test", (0, 150, 0))])]
    low = [snap(sites=[site("a.test", (0, 50, 0))])]
    first = deb.update(rules.evaluate(high, {}, 0))
    assert [(s, a.kind, a.subject) for s, a in first] == [(FIRING, "backlog", "a.test")]
    assert deb.update(rules.evaluate(high, {}, 1)) == []
    assert [s for s, _ in deb.update(rules.evaluate(low, {}, 2))] == [RESOLVED]
    assert [s for s, _ in deb.update(rules.evaluate(high, {}, 3))] == [FIRING]


def test_dead_letter_growth_alerts_after_the_baseline_and_clears_when_quiet() -> None:
    """The first look is the baseline; growth fires; quiet for dlq_quiet_s clears it."""
    rules, deb = AlertRules(dlq_quiet_s=10), Debouncer()
    assert deb.update(rules.evaluate([snap(sites=[site("a", dead=5)])], {}, 0)) == []
    fired = deb.update(rules.evaluate([snap(sites=[site("a", dead=7)])], {}, 1))
    assert [(s, a.kind, a.value) for s, a in fired] == [(FIRING, "dead_letters", 7)]
    assert deb.update(rules.evaluate([snap(sites=[site("a", dead=7)])], {}, 5)) == []
    assert [s for s, _ in deb.update(rules.evaluate([snap(sites=[site("a", dead=7)])], {}, 12))] == [RESOLVED]


def test_dead_node_alert_names_the_node() -> None:
    """A dead node fires one alert naming it; it resolves when the node is alive again."""
    rules, deb = AlertRules(), Debouncer()
    dead = {"c": node_states({"w1": {"last_seen": 0, "heartbeat_s": 1, "host": "box"}}, 100)}
    alive = {"c": node_states({"w1": {"last_seen": 100, "heartbeat_s": 1}}, 100)}
    fired = deb.update(rules.evaluate([snap()], dead, 0))
    assert fired[0][0] == FIRING and "w1" in fired[0][1].summary and "box" in fired[0][1].summary
    assert [s for s, _ in deb.update(rules.evaluate([snap()], alive, 1))] == [RESOLVED]


def test_alert_state_survives_a_restart(tmp_path: Path) -> None:
    """Saved and loaded by a new monitor: a firing alert does not fire again, a cleared one resolves, DLQ growth counts."""
    path = tmp_path / "alerts.json"
    rules, deb = AlertRules(backlog_threshold=100, dlq_quiet_s=10), Debouncer()
    high = [snap(sites=[site("a.test", (0, 150, 0), dead=2)])]
    assert deb.update(rules.evaluate(high, {}, 1000.0)) != []  # backlog fires; dead letters: baseline 2
    AlertState(path).save(rules, deb, 1000.0)

    rules2, deb2 = AlertRules(backlog_threshold=100, dlq_quiet_s=10), Debouncer()
    assert AlertState(path).load(rules2, deb2, 5.0)  # another process: another monotonic clock
    assert deb2.update(rules2.evaluate(high, {}, 6.0)) == []  # still firing: not sent again
    grown = [snap(sites=[site("a.test", (0, 50, 0), dead=4)])]  # backlog cleared, 2 more dead letters
    changes = {(st, a.kind) for st, a in deb2.update(rules2.evaluate(grown, {}, 7.0))}
    assert changes == {(RESOLVED, "backlog"), (FIRING, "dead_letters")}


def test_unreadable_alert_state_is_set_aside_not_fatal(tmp_path: Path) -> None:
    """A corrupt state file is moved to <file>.bad and the monitor starts with no alert state."""
    path = tmp_path / "alerts.json"
    path.write_text('{"version": 1, "active": [{"key": "x"}]')
    rules, deb = AlertRules(), Debouncer()
    assert AlertState(path).load(rules, deb, 0.0) is False
    assert not path.exists() and (tmp_path / "alerts.json.bad").exists() and deb.active == {}
    with pytest.raises(ConfigError, match="--state-file"):
        MonitorSettings(state_file=str(tmp_path / "missing-dir" / "alerts.json"))


def test_webhook_bodies_are_robot_text_or_plain_json() -> None:
    """The text format is DingTalk/WeCom's {"msgtype": "text"}; json is the alert itself."""
    rules, deb = AlertRules(backlog_threshold=1), Debouncer()
    (_, alert), = deb.update(rules.evaluate([snap(sites=[site("a.test", (5, 0, 0))])], {}, 0))
    text = render(alert, FIRING, "text", now_s=0)
    assert text["msgtype"] == "text" and text["text"]["content"].startswith("[FIRING] streams-sched: backlog of site a.test")
    assert render(alert, RESOLVED, "json")["status"] == RESOLVED


def test_dingtalk_signature() -> None:
    """The signed URL carries timestamp and the base64 HMAC-SHA256 of 'timestamp\\nsecret'."""
    url = signed_url("https://example.invalid/robot/send?access_token=x", "SEC", now_ms=1700000000000)
    q = parse_qs(urlparse(url).query)
    expected = base64.b64encode(hmac.new(b"SEC", b"1700000000000\nSEC", hashlib.sha256).digest()).decode()
    assert q["timestamp"] == ["1700000000000"] and unquote_plus(url.split("sign=")[1]) == expected


# -- exporter ----------------------------------------------------------------------------


def test_site_labels_are_capped_and_the_rest_summed_as_other() -> None:
    """Over max_sites, the busiest sites keep their label and the others add up in site="_other"."""
    sites = [site(f"s{i}.test", (0, i * 10, 0), pending=i, stats={"acked": i}) for i in range(5)]
    lab = SiteLabeller(2)
    s = snap(sites=sites)
    lab.update(s)
    fams = {f.name: f for f in build_families([s], {}, lab)}
    backlog = {(x.labels["site"], x.labels["priority"]): x.value for x in fams["streams_sched_backlog"].samples}
    assert backlog[("s4.test", "default")] == 40 and backlog[("s3.test", "default")] == 30
    assert backlog[(OTHER, "default")] == 0 + 10 + 20
    acked = {x.labels["site"]: x.value for x in fams["streams_sched_acked"].samples}
    assert sum(acked.values()) == 0 + 1 + 2 + 3 + 4
    unl = fams["streams_sched_sites_unlabelled"].samples[0].value
    assert unl == 3
    lab.update(snap(sites=[site("new.test", (0, 999, 0)), *sites]))
    assert lab.label("c", "new.test") == OTHER and lab.label("c", "s4.test") == "s4.test"  # sticky


def test_exported_names_follow_prometheus_conventions() -> None:
    """Every family is prefixed streams_sched_, counters end in _total, durations in _seconds."""
    names = metric_names()
    assert all(n.startswith("streams_sched_") for n in names)
    assert {"streams_sched_enqueued_total", "streams_sched_acked_total", "streams_sched_backlog"} <= names
    assert "streams_sched_oldest_pending_seconds" in names


def test_bitmap_filter_size_counts_full_layers_and_the_newest() -> None:
    """A bitmap filter with two full layers of 100 and 200 and 7 in the third holds 307."""
    assert bitmap_items(3, 7, 100, 2) == 307
    assert bitmap_items(0, 0, 100, 2) == 0


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_s": 0}, "--interval"),
        ({"lease_s": -1}, "--lease-seconds"),
        ({"max_deliveries": 0}, "--max-deliveries"),
        ({"crawls": ("bad name",)}, "--prefix"),
        ({"redis_url": "http://x"}, "--redis-url"),
        ({"batch": 0}, "--batch"),
    ],
)
def test_bad_reclaimer_settings_name_the_option(kwargs: dict, message: str) -> None:
    """A bad reclaimer option fails when the settings are built, naming the option."""
    with pytest.raises(ConfigError, match=message):
        ReclaimerSettings(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"webhook_url": "ftp://x"}, "--webhook-url"),
        ({"webhook_format": "xml"}, "--webhook-format"),
        ({"backlog_threshold": -1}, "--backlog-threshold"),
        ({"max_sites": -1}, "--max-sites"),
        ({"metrics_port": 70000}, "--metrics-port"),
    ],
)
def test_bad_monitor_settings_name_the_option(kwargs: dict, message: str) -> None:
    """A bad monitor option fails when the settings are built, naming the option."""
    with pytest.raises(ConfigError, match=message):
        MonitorSettings(**kwargs)


def test_metrics_port_accepts_a_port_or_a_range() -> None:
    """STREAMS_METRICS_PORT is a port, a range, or empty for off; anything else is a ConfigError."""
    assert parse_ports(9410) == [9410] and parse_ports("9410-9412") == [9410, 9411, 9412]
    assert parse_ports(None) == [] and parse_ports("") == []
    for bad in ("http", "9412-9410", 70000, True):
        with pytest.raises(ConfigError, match="STREAMS_METRICS_PORT"):
            parse_ports(bad)


# -- watch ---------------------------------------------------------------------------------


def test_progress_line_shows_share_done_rate_and_eta() -> None:
    """The progress line shows done/enqueued, what is left, the rate and the time left."""
    t = {"acked": 40, "dead": 10, "enqueued": 100, "backlog": 30, "pending": 15, "delayed": 5}
    line = progress_line(t, 2.5)
    assert "50.0%" in line and "done 50/100" in line and "left 50" in line and "ETA 20s" in line
    assert "drained" in progress_line({**t, "backlog": 0, "pending": 0, "delayed": 0}, 0)
    p = Progress(window_s=60)
    assert p.rate() is None
    for i in range(0, 100, 10):
        p.add(float(i), i * 3)
    assert p.rate() == pytest.approx(3.0)


# -- alerts about the Redis servers -------------------------------------------------------


def mem(evicted: int = 0, used: int = 100, maxmemory: int = 0, server: str = "10.0.0.1:6379",
        policy: str = "allkeys-lru") -> ServerMemory:
    return ServerMemory(server, used, maxmemory, policy, evicted)


def test_evictions_alert_only_while_a_crawl_runs_and_clear_when_quiet() -> None:
    """evicted_keys growth fires redis_evicting while a worker is alive or a lease is out (or was, within
    RUNNING_WINDOW_S), not with no crawl running; it clears after dlq_quiet_s without growth, and a
    restarted Redis is a new baseline."""
    rules, deb = AlertRules(dlq_quiet_s=10), Debouncer()
    alive = {"c": node_states({"w1": {"last_seen": 100, "heartbeat_s": 5}}, 100)}
    idle: dict = {}
    assert deb.update(rules.evaluate([snap()], idle, 0, [mem(5)])) == []  # the baseline
    assert deb.update(rules.evaluate([snap()], idle, 1, [mem(9)])) == []  # no crawl running
    fired = deb.update(rules.evaluate([snap()], alive, 2, [mem(20)]))
    assert [(s, a.kind, a.subject, a.value) for s, a in fired] == [(FIRING, "redis_evicting", "10.0.0.1:6379", 20)]
    assert "allkeys-lru" in fired[0][1].summary and "+11" in fired[0][1].summary and "noeviction" in fired[0][1].summary
    leased = [snap(sites=[site("a.test", pending=3)])]
    assert deb.update(rules.evaluate(leased, idle, 5, [mem(30)])) == []  # a lease out: still running
    assert [s for s, _ in deb.update(rules.evaluate([snap()], idle, 16, [mem(30)]))] == [RESOLVED]
    assert deb.update(rules.evaluate([snap()], alive, 17, [mem(2)])) == []  # Redis restarted: baseline 2
    # evicted with the rest, the crawl looks like none: seen running within RUNNING_WINDOW_S, it counts
    assert [a.kind for _, a in deb.update(rules.evaluate([], idle, 17 + RUNNING_WINDOW_S - 1, [mem(9)]))] == ["redis_evicting"]
    rules, deb = AlertRules(dlq_quiet_s=10), Debouncer()
    rules.evaluate([snap()], alive, 0, [mem(5)])
    assert deb.update(rules.evaluate([], idle, RUNNING_WINDOW_S + 1, [mem(9)])) == []  # too long ago


def test_memory_alert_from_ninety_percent_of_maxmemory_only_where_it_is_set() -> None:
    """redis_memory fires at 90% of maxmemory and resolves below it; maxmemory 0 (no limit) never fires."""
    rules, deb = AlertRules(), Debouncer()
    assert deb.update(rules.evaluate([], {}, 0, [mem(used=899, maxmemory=1000), mem(used=10**9, server="b:1")])) == []
    fired = deb.update(rules.evaluate([], {}, 1, [mem(used=950, maxmemory=1000)]))
    assert [(s, a.kind, a.value, a.threshold) for s, a in fired] == [(FIRING, "redis_memory", 0.95, 0.9)]
    assert "95% of its maxmemory" in fired[0][1].summary and "streams-sched purge" in fired[0][1].summary
    assert [s for s, _ in deb.update(rules.evaluate([], {}, 2, [mem(used=500, maxmemory=1000)]))] == [RESOLVED]


def test_eviction_baselines_survive_a_restart(tmp_path: Path) -> None:
    """The evicted_keys baseline is in the state file: evictions while the monitor was down still fire."""
    path = tmp_path / "alerts.json"
    alive = {"c": node_states({"w1": {"last_seen": 100, "heartbeat_s": 5}}, 100)}
    rules, deb = AlertRules(), Debouncer()
    rules.evaluate([snap()], alive, 0, [mem(5)])
    AlertState(path).save(rules, deb, 0)
    rules2, deb2 = AlertRules(), Debouncer()
    assert AlertState(path).load(rules2, deb2, 0)
    assert [a.kind for _, a in deb2.update(rules2.evaluate([snap()], alive, 1, [mem(8)]))] == ["redis_evicting"]


def test_server_families_export_each_server() -> None:
    """Evictions, memory, maxmemory and the policy label are exported per server, nothing without INFO."""
    families = {f.name: f for f in build_server_families([mem(7, 900, 1000), mem(0, 5, 0, server="b:1", policy="noeviction")])}
    evicted = {s.labels["server"]: s.value for s in families["streams_sched_redis_evicted_keys"].samples if s.name.endswith("_total")}
    assert evicted == {"10.0.0.1:6379": 7, "b:1": 0}
    assert {s.labels["server"]: s.value for s in families["streams_sched_redis_maxmemory_bytes"].samples} == {"10.0.0.1:6379": 1000, "b:1": 0}
    assert {(s.labels["server"], s.labels["policy"]) for s in families["streams_sched_redis_maxmemory_policy"].samples} == {
        ("10.0.0.1:6379", "allkeys-lru"), ("b:1", "noeviction")}
    assert build_server_families([]) == []
    assert {"streams_sched_redis_evicted_keys_total", "streams_sched_redis_used_memory_bytes"} <= metric_names()


def test_memory_over_maxmemory_refuses_writes_unless_allkeys_evicts() -> None:
    """A server over its maxmemory (buffers not counted) refuses writes under noeviction or volatile-*, never without a limit or under allkeys-*."""
    assert ServerMemory("a:1", 1001, 1000, "noeviction", 0).refuses_writes
    assert ServerMemory("a:1", 1001, 1000, "volatile-lru", 0).refuses_writes
    assert not ServerMemory("a:1", 1001, 1000, "allkeys-lru", 0).refuses_writes
    assert not ServerMemory("a:1", 1001, 1000, "noeviction", 0, not_counted=10).refuses_writes
    assert not ServerMemory("a:1", 10**9, 0, "noeviction", 0).refuses_writes


class _Log:
    """Records the daemon's log events as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level: str):  # type: ignore[no-untyped-def]
        return lambda event, **fields: self.lines.append((level, event, fields))


def test_daemon_loop_says_each_refusal_once_and_when_writes_go_through_again() -> None:
    """run_passes logs a refusal of writes once as an ERROR with the fix, counts the repeats, and says when a pass works again."""
    from redis.exceptions import OutOfMemoryError

    from streams_sched.service.daemon import StopFlag, run_passes

    outcomes = [OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")] * 4 + [None, None]
    errors, log, stop = [], _Log(), StopFlag()

    def one_pass() -> None:
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome is not None:
            raise outcome

    code = run_passes(one_pass, interval_s=0.0, burst=False, stop_flag=stop, max_backoff_s=0.01, log=log,
                      hint="retrying", role="reclaimer", on_error=lambda: errors.append(1))
    assert code == 0 and len(errors) == 4
    assert [(level, event) for level, event, _ in log.lines] == [("error", "redis_refused"), ("warning", "redis_accepts_writes_again")]
    hint = log.lines[0][2]["hint"]
    assert "raise maxmemory" in hint and hint.endswith("; retrying")
    assert log.lines[1][2]["refused"] == 4


def test_daemon_loop_says_why_a_cluster_is_down_after_a_while_and_not_during_a_failover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run_passes: CLUSTERDOWN shorter than a failover is the usual warning; once it lasts, one
    redis_cluster_down ERROR with the diagnosis, and in burst mode the failed pass carries it."""
    from redis.exceptions import ClusterDownError

    import streams_sched.service.daemon as daemon

    monkeypatch.setattr(daemon, "CLUSTER_DOWN_AFTER_S", 0.05)
    down = "the Redis Cluster is down (cluster_state:fail): slots 0-5460 have no master"
    outcomes: list[Exception | None] = [ClusterDownError("The cluster is down")] * 6 + [None]
    log, stop = _Log(), daemon.StopFlag()

    def one_pass() -> None:
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome is not None:
            raise outcome

    assert daemon.run_passes(one_pass, interval_s=0.0, burst=False, stop_flag=stop, max_backoff_s=0.03, log=log,
                             hint="retrying", diagnose=lambda: down) == 0
    events = [(level, event) for level, event, _ in log.lines]
    assert events[0] == ("warning", "redis_unreachable")
    assert events.count(("error", "redis_cluster_down")) == 1
    assert next(f for _, e, f in log.lines if e == "redis_cluster_down")["diagnosis"] == down
    burst_log = _Log()

    def failing() -> None:
        raise ClusterDownError("The cluster is down")

    assert daemon.run_passes(failing, interval_s=0.0, burst=True, stop_flag=daemon.StopFlag(), max_backoff_s=0.01,
                             log=burst_log, hint="retrying", diagnose=lambda: down) == 1
    assert burst_log.lines[-1][1] == "pass_failed" and burst_log.lines[-1][2]["hint"] == down
