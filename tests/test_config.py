"""Bad settings fail at start with the setting's name and value."""

from __future__ import annotations

import dataclasses

import pytest

from streams_sched.config import SETTINGS, STRICT_RATIO, StreamsConfig, parse_band_ratio
from streams_sched.errors import ConfigError


def build(**settings):
    base = {"REDIS_URL": "redis://localhost:6379/0"}
    base.update(settings)
    return StreamsConfig.from_settings(base, "spider")


def test_defaults_are_documented_values() -> None:
    """With only REDIS_URL the documented defaults apply and the crawl is the spider name."""
    cfg = build()
    assert cfg.crawl == "spider" and cfg.lease_seconds == 300 and cfg.max_deliveries == 5
    assert cfg.dedupe == "auto" and cfg.close_on_drain is True and cfg.band_ratio == (8, 3, 1)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("STREAMS_LEASE_SECONDS", -5, "greater than 0"),
        ("STREAMS_LEASE_SECONDS", "soon", "expected a number"),
        ("STREAMS_MAX_DELIVERIES", 0, "at least 1"),
        ("STREAMS_MAX_DELIVERIES", 2.5, "whole number"),
        ("STREAMS_DEDUPE", "cuckoo", "expected one of"),
        ("STREAMS_BLOOM_ERROR_RATE", 1.5, "between 0 and 1"),
        ("STREAMS_BAND_RATIO", "5:3", "three weights"),
        ("STREAMS_BAND_RATIO", "5:0:1", "at least 1"),
        ("STREAMS_BAND_RATIO", "a:b:c", "whole numbers"),
        ("STREAMS_PREFIX", "has space", "crawl name"),
        ("STREAMS_PREFIX", "{tag}", "braces"),
        ("STREAMS_CLOSE_ON_DRAIN", "maybe", "True or False"),
        ("STREAMS_CAPABILITIES", ["http", "gpu"], "subset"),
        ("STREAMS_LOW_PRIORITY_MAX", 5, "below STREAMS_HIGH_PRIORITY_MIN"),
        ("REDIS_URL", "http://localhost:6379", "redis://"),
        ("STREAMS_NODE_ID", "bad id!", "letters"),
        ("STREAMS_SITES", {"a.test": {"rate": -1}}, "0 or more"),
        ("STREAMS_SITES", {"a.test": {"speed": 1}}, "unknown policy field"),
        ("STREAMS_SITES", {"a b": {"rate": 1}}, "invalid site name"),
        ("STREAMS_UNSERIALIZABLE", "drop", "expected one of ('local', 'error')"),
    ],
)
def test_invalid_setting_names_setting_and_value(setting: str, value: object, message: str) -> None:
    """Each invalid value raises ConfigError naming the setting and showing the value."""
    with pytest.raises(ConfigError) as info:
        build(**{setting: value})
    text = str(info.value)
    assert setting in text and message in text
    if not isinstance(value, dict):
        assert repr(value) in text


def test_missing_redis_url_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without REDIS_URL anywhere the error says to set it."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="set REDIS_URL"):
        StreamsConfig.from_settings({}, "spider")


def test_redis_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """REDIS_URL falls back to the environment variable."""
    monkeypatch.setenv("REDIS_URL", "redis://envhost:6380/1")
    assert StreamsConfig.from_settings({}, "s").redis_url == "redis://envhost:6380/1"


def test_band_ratio_forms() -> None:
    """Ratios parse from "5:3:2", a list, or "strict"."""
    assert parse_band_ratio("5:3:2") == (5, 3, 2)
    assert parse_band_ratio([1, 1, 1]) == (1, 1, 1)
    assert parse_band_ratio("strict") == STRICT_RATIO


def test_band_ratio_as_a_dict_of_bands() -> None:
    """A {band: weight} dict works; an unknown band name is refused, naming the setting and the band."""
    assert parse_band_ratio({"high": 5, "default": 2, "low": 1}) == (5, 2, 1)
    with pytest.raises(ConfigError, match=r"STREAMS_BAND_RATIO=.*unknown band\(s\) \['urgent'\]"):
        build(STREAMS_BAND_RATIO={"high": 5, "urgent": 9})


def test_sites_given_as_json_text() -> None:
    """STREAMS_SITES given as JSON text (`-s` or the environment) is parsed; broken JSON is named."""
    assert build(STREAMS_SITES='{"a.test": {"rate": 2}}').sites == {"a.test": {"rate": 2}}
    with pytest.raises(ConfigError, match="STREAMS_SITES=.*not valid JSON"):
        build(STREAMS_SITES='{"a.test": ')


def test_meta_classes_and_codecs_settings() -> None:
    """STREAMS_META_CLASSES takes a list or comma text, STREAMS_META_CODECS a dict or JSON text;
    wrong shapes fail naming the setting."""
    assert build(STREAMS_META_CLASSES="a.B, c.D").meta_classes == ("a.B", "c.D")
    assert build(STREAMS_META_CLASSES=["a.B"]).meta_classes == ("a.B",)
    assert build(STREAMS_META_CODECS='{"a.B": "a.codec"}').meta_codecs == {"a.B": "a.codec"}
    assert build().meta_codecs == {} and build().meta_classes == ()
    with pytest.raises(ConfigError, match="STREAMS_META_CODECS=.*not valid JSON"):
        build(STREAMS_META_CODECS="{")
    with pytest.raises(ConfigError, match="STREAMS_META_CODECS=.*class import path -> codec import path"):
        build(STREAMS_META_CODECS=["a.B"])
    with pytest.raises(ConfigError, match="STREAMS_META_CLASSES"):
        build(STREAMS_META_CLASSES=[1])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://localhost:notaport/0", "port is not a number"),
        ("redis:///0", "no host"),
        ("redis://localhost:6379/zero", "database 'zero' is not a number"),
        ("redis://localhost:6379/0?clustr=1", "unknown option(s) ['clustr']"),
        ("rediss://localhost:6379/0?ssl_ca_certs=/nonexistent/ca.pem", "no such file"),
        ("redis://localhost:6379/0?ssl_ca_certs=/etc/hostname", "need a rediss:// URL"),
        ("unix://", "socket path"),
        ("redis://a:7000,b:7001/0", "several hosts: nodes of a Redis Cluster take ?cluster=1"),
        ("redis://a:7000,b:x/0?cluster=1", "cluster node 'b:x': the port 'x' is not a port number"),
        ("redis://a:7000,/0?cluster=1", "a cluster node without a host"),
        ("redis://a:7000,b:7001/0?cluster=1&bogus=1", "unknown option(s) ['bogus']"),
    ],
)
def test_bad_redis_url_is_refused_before_connecting(url: str, message: str) -> None:
    """REDIS_URL mistakes are caught when the settings are read, with what is wrong."""
    with pytest.raises(ConfigError) as info:
        build(REDIS_URL=url)
    assert str(info.value).startswith("REDIS_URL=") and message in str(info.value)


def test_a_cluster_url_may_name_several_nodes_in_the_form_of_the_sentinel_url() -> None:
    """redis://[user:pass@]h1:p1,h2:p2,h3/0?cluster=1 is accepted; every node becomes a startup
    node of the cluster client, the URL's options and credentials apply to all."""
    from streams_sched.connect.urls import cluster_nodes

    url = "redis://u:p%40ss@h1:7000,[::1]:7001,h3/0?cluster=1&socket_timeout=3"
    assert build(REDIS_URL=url).redis_url == url
    assert cluster_nodes(url) == (
        "redis://u:p%40ss@h1:7000/0?cluster=1&socket_timeout=3", [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    )


def test_password_never_appears_in_url_errors() -> None:
    """An error about a REDIS_URL with a password shows the URL with the password masked."""
    with pytest.raises(ConfigError) as info:
        build(REDIS_URL="redis://worker:s3cret@localhost:6379/0?bogus=1")
    assert "s3cret" not in str(info.value) and "worker:***@localhost" in str(info.value)


def test_from_settings_defaults_are_the_field_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no settings, every field keeps its dataclass default (feed_key follows scrapy-redis)."""
    monkeypatch.delenv("STREAMS_ALLOW_UNTESTED_SCRAPY", raising=False)
    monkeypatch.delenv("STREAMS_ALLOW_EVICTION", raising=False)
    cfg = build()
    from_settings_only = {"redis_url", "crawl", "feed_key"}
    for f in dataclasses.fields(StreamsConfig):
        if f.name in from_settings_only:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert default is not dataclasses.MISSING, f.name
        assert getattr(cfg, f.name) == default, f.name
    assert cfg.feed_key == "spider:start_urls"  # REDIS_START_URLS_KEY's default; "" = no feed
    assert StreamsConfig("redis://localhost:6379/0", "spider").feed_key == ""


def test_every_field_has_its_setting() -> None:
    """Each field is set by a row of SETTINGS and each row sets a field, so none is forgotten."""
    names = {f.name for f in dataclasses.fields(StreamsConfig)}
    assert {row.field for row in SETTINGS} == names
    rows = {row.name: row for row in SETTINGS}
    for f in dataclasses.fields(StreamsConfig):
        assert rows[f.metadata["setting"]].field == f.name, f.name


#: settings whose every text is a valid value (any text is a Redis key name)
FREE_TEXT = {"STREAMS_FEED_KEY", "REDIS_START_URLS_KEY"}


@pytest.mark.parametrize("setting", sorted(row.name for row in SETTINGS if row.name not in FREE_TEXT))
def test_every_setting_names_itself_when_bad(setting: str) -> None:
    """A nonsense value of any setting fails at start with a ConfigError naming it and the value."""
    bad: object = 42 if setting in ("STREAMS_REQUEST_CLASSES", "STREAMS_META_CLASSES") else "bogus value!"
    with pytest.raises(ConfigError) as caught:
        build(**{setting: bad})
    assert caught.value.setting == setting
    assert str(bad) in str(caught.value)


def test_allow_eviction_from_the_setting_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """STREAMS_ALLOW_EVICTION defaults to False, comes from the environment when unset, and the setting wins."""
    monkeypatch.delenv("STREAMS_ALLOW_EVICTION", raising=False)
    assert build().allow_eviction is False
    assert build(STREAMS_ALLOW_EVICTION="true").allow_eviction is True
    monkeypatch.setenv("STREAMS_ALLOW_EVICTION", "1")
    assert build().allow_eviction is True
    assert build(STREAMS_ALLOW_EVICTION=False).allow_eviction is False
    with pytest.raises(ConfigError, match="STREAMS_ALLOW_EVICTION='sometimes': expected True or False"):
        build(STREAMS_ALLOW_EVICTION="sometimes")


def test_tracking_every_page_and_a_revisit_window_together_is_refused_with_the_fix() -> None:
    """STREAMS_REVISIT_EVERY_SECONDS with STREAMS_REVISIT_AFTER_SECONDS would track a rediscovered page twice: refused at start, naming both and the fix; min above max is refused too."""
    with pytest.raises(ConfigError, match=r"STREAMS_REVISIT_EVERY_SECONDS=3600.0: STREAMS_REVISIT_AFTER_SECONDS=86400.0 is set too.*= 0"):
        StreamsConfig.from_settings({"REDIS_URL": "redis://x", "STREAMS_REVISIT_EVERY_SECONDS": 3600,
                                     "STREAMS_REVISIT_AFTER_SECONDS": 86400}, "s")
    with pytest.raises(ConfigError, match="STREAMS_REVISIT_MIN_SECONDS=600.0: must not be above STREAMS_REVISIT_MAX_SECONDS=60.0"):
        StreamsConfig.from_settings({"REDIS_URL": "redis://x", "STREAMS_REVISIT_MIN_SECONDS": 600,
                                     "STREAMS_REVISIT_MAX_SECONDS": 60}, "s")
