"""The Scrapy versions streams-sched declares are the ones it checks at start and tests,
and a worker on any other Scrapy stops at once with one line naming the version and the range."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import pytest
import scrapy
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from scrapy.core import engine

from streams_sched.errors import ScrapyCompatError
from streams_sched.worker.engine import SUPPORTED_SCRAPY, EngineHooks, check_scrapy

from helpers import scrapy_crawl, scrapy_project, start_errors

pytestmark = pytest.mark.scrapy_matrix

ROOT = Path(__file__).resolve().parent.parent
@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    # scripts/matrix.sh sets it so that a release above the range can be tried
    monkeypatch.delenv("STREAMS_ALLOW_UNTESTED_SCRAPY", raising=False)


def _declared() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if re.match(r"scrapy\b(?!-)", d))[len("scrapy"):]


def _matrix() -> list[str]:
    text = (ROOT / "scripts" / "matrix.sh").read_text()
    found = re.search(r'SCRAPY_MATRIX="\$\{SCRAPY_MATRIX:-([^}]*)\}"', text)
    assert found, "scripts/matrix.sh has no SCRAPY_MATRIX default"
    return found.group(1).split()


def test_declared_range_is_the_checked_range_and_its_floor_is_tested() -> None:
    """pyproject.toml declares the range check_scrapy enforces; the matrix tests its floor, and the
    main suite runs on a Scrapy inside it."""
    assert SpecifierSet(_declared()) == SpecifierSet(SUPPORTED_SCRAPY)
    spec = SpecifierSet(SUPPORTED_SCRAPY)
    floor = next(Version(s.version) for s in spec if s.operator == ">=")
    versions = [Version(v) for v in _matrix()]
    assert versions[0] == floor, f"scripts/matrix.sh must start at the declared floor {floor}"
    assert all(v in spec for v in versions)
    assert Version(scrapy.__version__) in spec


def test_the_installed_scrapy_passes_the_check() -> None:
    """The Scrapy this suite runs on is supported and has the hook points."""
    check_scrapy()


@pytest.mark.parametrize("version", ["2.12.1", "2.11.0", "1.8.4"])
def test_a_scrapy_below_the_range_is_refused_naming_version_and_range(version: str) -> None:
    """A Scrapy older than the floor is refused, even with STREAMS_ALLOW_UNTESTED_SCRAPY."""
    for allow in (False, True):
        with pytest.raises(ScrapyCompatError) as err:
            check_scrapy(version, allow_untested=allow)
        assert f"Scrapy {version} is not supported" in str(err.value)
        assert SUPPORTED_SCRAPY in str(err.value)
        assert "ALLOW_UNTESTED" not in str(err.value)


def test_a_scrapy_above_the_range_starts_only_when_allowed(caplog: pytest.LogCaptureFixture) -> None:
    """A newer, untested Scrapy is refused unless STREAMS_ALLOW_UNTESTED_SCRAPY is set; then a warning."""
    with pytest.raises(ScrapyCompatError, match=r"Scrapy 2\.20\.0 is not supported.*STREAMS_ALLOW_UNTESTED_SCRAPY"):
        check_scrapy("2.20.0")
    check_scrapy("2.20.0", allow_untested=True)
    assert "above the tested range" in caplog.text and "scripts/matrix.sh 2.20.0" in caplog.text


def test_an_engine_without_the_hook_points_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supported version number whose engine slot lost remove_request is refused at start."""
    monkeypatch.delattr(engine._Slot, "remove_request")
    with pytest.raises(ScrapyCompatError, match=r"no longer has the hook points.*_Slot\.remove_request"):
        check_scrapy()
    monkeypatch.delattr(engine, "_Slot")
    with pytest.raises(ScrapyCompatError, match=r"no longer has the hook points"):
        check_scrapy(allow_untested=True)


def test_hooking_a_slot_without_the_attributes_is_refused() -> None:
    """EngineHooks refuses a running engine whose slot lacks an attribute it hooks, naming it."""

    class Slot:
        remove_request = close = inprogress = None
        scheduler = object()

    class Crawler:
        class engine:  # noqa: N801
            _slot = Slot()

    with pytest.raises(ScrapyCompatError, match=r"engine\._slot\.nextcall missing.*" + re.escape(SUPPORTED_SCRAPY)):
        EngineHooks(Crawler(), Slot.scheduler, lambda request: None)


_PATCHES = {
    "old-version": "import scrapy\nscrapy.__version__ = '2.12.1'\n",
    "new-version": "import scrapy\nscrapy.__version__ = '2.99.0'\n",
    "no-hook-point": "from scrapy.core import engine\ndel engine._Slot.remove_request\n",
}


@pytest.mark.e2e
@pytest.mark.parametrize("patch", sorted(_PATCHES))
def test_scrapy_crawl_on_an_unsupported_scrapy_exits_1_at_once_with_one_line(tmp_path: Path, patch: str) -> None:
    """A real `scrapy crawl` on an unsupported Scrapy (faked in the project's settings) exits 1
    within seconds with one CRITICAL line naming the version and the supported range."""
    project = scrapy_project(tmp_path)
    settings = project / "synth_project" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + _PATCHES[patch])
    started = time.monotonic()
    # nothing listens on port 1: a worker that got past the check would wait the connect timeout
    done = scrapy_crawl(project, {"REDIS_URL": "redis://127.0.0.1:1/0", "STREAMS_CONNECT_TIMEOUT_SECONDS": 60})
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    errors = start_errors(output)
    assert len(errors) == 1, output[-3000:]
    assert SUPPORTED_SCRAPY in errors[0]
    version = "2.12.1" if patch == "old-version" else "2.99.0" if patch == "new-version" else scrapy.__version__
    assert f"Scrapy {version}" in errors[0]
    first = next(line for line in output.splitlines() if "] ERROR:" in line or "] CRITICAL:" in line)
    assert first == errors[0]  # Scrapy's tracebacks come after it
    assert elapsed < 45  # did not wait for Redis


_CLOSE_HOOK = """
import sys
from scrapy.utils.reactor import install_reactor
install_reactor(sys.argv[1])
from twisted.internet import defer, reactor
from scrapy import Request
from scrapy.core.engine import _Slot
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.reactor import CallLaterOnce
from streams_sched.worker.engine import EngineHooks

def closed_by_engine(in_progress):
    class Engine: pass
    class Crawler: engine = Engine()
    scheduler, calls = object(), []
    slot = Crawler.engine._slot = _Slot(True, CallLaterOnce(lambda: None), scheduler)
    for i in range(in_progress):
        slot.add_request(Request(f"http://a.test/{i}"))
    hooks = EngineHooks(Crawler(), scheduler, lambda request: None)
    hooks.on_closing(lambda: calls.append("begin"), 0.3, lambda n: calls.append(f"timed_out:{n}"))
    closing = slot.close()
    # what the engine does with it: 2.13 chains callbacks on it, later ones await it
    kind = "deferred" if isinstance(closing, defer.Deferred) else "coroutine"
    d = closing if kind == "deferred" else deferred_from_coro(closing)
    d.addBoth(lambda _: calls.append("closed"))
    return kind, d, calls

async def main():
    for n in (0, 2):
        kind, d, calls = closed_by_engine(n)
        await maybe_deferred_to_future(d)
        print(kind, ",".join(calls))

def run():
    d = defer.ensureDeferred(main()) if "asyncio" not in sys.argv[1] else deferred_from_coro(main())
    d.addErrback(lambda f: print(f.getTraceback()))
    d.addBoth(lambda _: reactor.stop())

reactor.callWhenRunning(run)
reactor.run()
"""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "reactor_path",
    ["twisted.internet.asyncioreactor.AsyncioSelectorReactor", "twisted.internet.epollreactor.EPollReactor"],
    ids=["asyncio", "epoll"],
)
def test_the_close_hook_returns_what_the_engine_expects_and_bounds_the_wait(reactor_path: str) -> None:
    """On the installed Scrapy's real engine slot, the hooked close() is a Deferred on 2.13 and a
    coroutine from 2.14 (a worker that returns the wrong one hangs at close); it calls begin, and with requests
    still in progress it reports them after the timeout and the close goes on."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLOSE_HOOK, reactor_path], capture_output=True, text=True, timeout=60)
    kind = "coroutine" if Version(scrapy.__version__) >= Version("2.14") else "deferred"
    assert done.stdout.splitlines() == [f"{kind} begin,closed", f"{kind} begin,timed_out:2,closed"], done.stdout + done.stderr
