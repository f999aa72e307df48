"""The eviction-policy decision and the error hints, without Redis (streams_sched/connect/server_checks.py)."""

from __future__ import annotations

import pytest

from streams_sched.connect.server_checks import (
    OK,
    REFUSE,
    TTL_KEYS,
    WARN,
    allowed_by_env,
    error_code,
    eviction_verdict,
    hint_for,
    refuses_writes,
)

WHERE = "Redis at redis://127.0.0.1:6379/0"
ALLOW = "set STREAMS_ALLOW_EVICTION = True"


def verdict(policy: str | None, allowed: bool = False, error: str = "") -> tuple[str, str]:
    v = eviction_verdict(policy, WHERE, allowed=allowed, allow_hint=ALLOW, error=error)
    return v.level, v.message


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "ALLKEYS-LRU", "allkeys-something-new"])
def test_allkeys_policies_are_refused_with_the_policy_and_the_fix(policy: str) -> None:
    """Every allkeys-* policy is refused, the message naming the server, the policy, noeviction and the allow option."""
    level, message = verdict(policy)
    assert level == REFUSE
    assert message.startswith(f"{WHERE} has maxmemory-policy {policy.lower()}: it evicts any key, including queued requests")
    assert "lost silently" in message and "CONFIG SET maxmemory-policy noeviction" in message and "redis.conf" in message
    assert message.endswith(f"or {ALLOW} to run anyway")


def test_allkeys_with_eviction_allowed_starts_with_a_warning() -> None:
    """With the allow option an allkeys-* policy is a warning that still says pages can be lost."""
    level, message = verdict("allkeys-lru", allowed=True)
    assert level == WARN and "can be lost silently" in message and "running anyway, as STREAMS_ALLOW_EVICTION" in message


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"])
def test_volatile_policies_warn_naming_the_keys_with_a_ttl(policy: str) -> None:
    """A volatile-* policy starts with a warning that lists each of our keys with a TTL and what losing it means."""
    level, message = verdict(policy)
    assert level == WARN and f"maxmemory-policy {policy}: at maxmemory it evicts keys that carry a TTL" in message
    for what, effect in TTL_KEYS:
        assert what in message and effect in message
    assert ":window" in message and "seen:<n>" in message and "feed-lock" in message and "ss:health" in message
    assert "no page is lost" in message and "OOM" in message
    assert verdict(policy, allowed=True) == (level, message)  # the option changes nothing here


def test_noeviction_passes_silently() -> None:
    """noeviction is OK with nothing to log."""
    assert verdict("noeviction") == (OK, "")
    assert verdict(" NoEviction ") == (OK, "")


def test_an_unknown_or_unreadable_policy_warns() -> None:
    """A policy this version does not know, or none at all, is a warning that says to set noeviction."""
    level, message = verdict("lru-of-the-future")
    assert level == WARN and "does not know" in message and "noeviction" in message
    level, message = verdict(None, error="INFO: NOPERM no info")
    assert level == WARN and "could not read the maxmemory-policy" in message and "NOPERM no info" in message
    assert "+info" in message


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", "OOM"),
        ("OOM command not allowed when used memory > 'maxmemory'. script: 8d1f, on @user_script:45.", "OOM"),
        ("NOPERM User worker has no permissions to run the 'xadd' command", "NOPERM"),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE"),
        ("ERR Error running script: @user_script:12: WRONGTYPE Operation against a key", "WRONGTYPE"),
        ("command not allowed when used memory > 'maxmemory'. script: 8d1f, on @user_script:45.", "OOM"),
        ("this user has no permissions to run the 'xadd' command", "NOPERM"),
        ("ERR unknown command 'FOO'", ""),
        ("BUSY Redis is busy running a script", ""),
        ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", "MISCONF"),
        ("Error running script: @user_script:3: -MISCONF Redis is configured to save RDB snapshots, but it's"
         " currently unable to persist to disk.", "MISCONF"),
        ("READONLY You can't write against a read only replica.", "READONLY"),
        ("You can't write against a read only replica. script: 8d1f, on @user_script:1.", "READONLY"),
    ],
)
def test_error_code_is_found_also_inside_a_script_error(error: str, code: str) -> None:
    """The error code comes from the reply's first word, from inside a failed script's message,
    or from the text redis-py leaves of OOM and NOPERM replies (it drops their code)."""
    assert error_code(error) == code


def test_hint_depends_on_the_error() -> None:
    """OOM names maxmemory and the three fixes; NOPERM the role's ACL rules; WRONGTYPE a foreign key; others nothing."""
    oom = hint_for("OOM command not allowed when used memory > 'maxmemory'.")
    assert "maxmemory" in oom and "raise maxmemory" in oom and "add a shard" in oom and "streams-sched purge" in oom
    assert "NOPERM" not in oom and "WRONGTYPE" not in oom
    noperm = hint_for("NOPERM no permissions", role="reclaimer")
    assert "reclaimer's ACL user" in noperm and "python -m streams_sched.admin.acl reclaimer" in noperm and "maxmemory" not in noperm
    assert "something else wrote" in hint_for("WRONGTYPE Operation against a key")
    assert hint_for("ERR unknown command") == ""


def test_allowed_by_env_reads_the_usual_true_words() -> None:
    """STREAMS_ALLOW_EVICTION=1/true/yes/on allows; anything else or unset does not."""
    assert all(allowed_by_env({"STREAMS_ALLOW_EVICTION": v}) for v in ("1", "true", "Yes", " on "))
    assert not any(allowed_by_env({"STREAMS_ALLOW_EVICTION": v}) for v in ("0", "false", "", "maybe"))
    assert not allowed_by_env({})


def test_misconf_and_readonly_hints_name_the_setting_and_the_fix() -> None:
    """MISCONF names stop-writes-on-bgsave-error and BGSAVE; READONLY says the given URL setting names a replica."""
    misconf = hint_for("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.")
    assert "stop-writes-on-bgsave-error" in misconf and "BGSAVE" in misconf and "Redis log" in misconf
    readonly = hint_for("You can't write against a read only replica.", setting="--redis-url (REDIS_URL)")
    assert readonly.startswith("READONLY means --redis-url (REDIS_URL) names a read-only replica")
    assert "point it at the primary" in readonly and "redis+sentinel://" in readonly
    assert "REDIS_URL names a read-only replica" in hint_for("READONLY You can't write against a read only replica.")


def test_only_oom_misconf_and_readonly_refuse_every_write() -> None:
    """refuses_writes gives the code of a refusal of every write, "" for other refusals and for what is not an error reply."""
    from redis.exceptions import ConnectionError, OutOfMemoryError, ReadOnlyError, ResponseError

    assert refuses_writes(OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")) == "OOM"
    assert refuses_writes(ReadOnlyError("You can't write against a read only replica.")) == "READONLY"
    assert refuses_writes(ResponseError("MISCONF Redis is configured to save RDB snapshots")) == "MISCONF"
    assert refuses_writes("NOPERM User worker has no permissions to run the 'xadd' command") == ""
    assert refuses_writes(ResponseError("WRONGTYPE Operation against a key")) == ""
    assert refuses_writes(ConnectionError("MISCONF in a connection error is not a reply")) == ""
