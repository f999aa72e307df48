"""The dependency versions CI installs (constraints.txt) satisfy what pyproject.toml
declares, and scripts/deps.sh checks the floors pyproject.toml declares."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
EDGE_PACKAGES = ("scrapy", "twisted", "w3lib", "redis", "hiredis", "msgpack")


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_constraints_pin_every_declared_dependency_inside_its_range() -> None:
    """Every dependency of the package and of its test, docs and bench extras is pinned in
    constraints.txt, to a version its declared range admits (a floor raised in pyproject.toml
    without refreshing the constraints fails here, not in a CI install)."""
    pins = _pins()
    for req in _requirements("test", "docs", "bench"):
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name}: run scripts/deps.sh refresh"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject.toml's {req}: run scripts/deps.sh refresh"
        )


def test_every_edge_package_has_a_declared_floor() -> None:
    """redis-py, hiredis, Scrapy, Twisted, w3lib and msgpack each have a ">=" floor in the
    package's own dependencies, which scripts/deps.sh lowest installs and tests."""
    floors = {}
    for req in _requirements():
        for spec in req.specifier:
            if spec.operator == ">=":
                floors[canonicalize_name(req.name)] = spec.version
    assert sorted(floors.keys() & set(EDGE_PACKAGES)) == sorted(EDGE_PACKAGES)
    text = (ROOT / "scripts" / "deps.sh").read_text()
    found = re.search(r'EDGE_PACKAGES="([^"]*)"', text)
    assert found and sorted(found.group(1).split()) == sorted(EDGE_PACKAGES)


@pytest.mark.e2e
def test_deps_script_reads_the_floors_from_pyproject() -> None:
    """scripts/deps.sh lowest pins each edge package at the floor pyproject.toml declares."""
    out = subprocess.run(
        ["bash", "-c", "source scripts/deps.sh && floors"], cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    got = dict(line.split("==") for line in out)
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name in EDGE_PACKAGES:
            floor = next(s.version for s in req.specifier if s.operator == ">=")
            assert got[name] == floor, (name, got[name], floor)


@pytest.mark.e2e
def test_newest_names_only_the_packages_newer_than_the_constraints(tmp_path: Path) -> None:
    """scripts/deps.sh newest compares what it installed with constraints.txt: the packages at
    another version are named with both versions, and none differing gives nothing (so the
    checks the main suite already ran on those versions are not run twice)."""
    pins = {line.partition("==")[0]: line.partition("==")[2]
            for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line and not line.startswith("#")}
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)

    def freeze(lines: list[str]) -> str:
        (fake / "python").write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
        (fake / "python").chmod(0o755)
        return subprocess.run(
            ["bash", "-c", f"source scripts/deps.sh && newer_than_constraints {tmp_path / 'venv'}"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()

    same = [f"{name}=={version}" for name, version in pins.items()]
    assert freeze(same) == ""
    w3lib = next(name for name in pins if name.lower() == "w3lib")
    newer = [line if not line.startswith(f"{w3lib}==") else f"{w3lib}==99.0" for line in same]
    assert freeze(newer) == f"{w3lib} 99.0 (constraints: {pins[w3lib]})"
