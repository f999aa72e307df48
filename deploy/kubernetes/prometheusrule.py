"""Write the PrometheusRule of the Kubernetes manifests from the shipped alert rules.

    python deploy/kubernetes/prometheusrule.py           # rewrite the manifest
    python deploy/kubernetes/prometheusrule.py --check   # exit 1 if it is out of date

compose/prometheus/alerts.yml is the one copy of the alert rules: Compose mounts it,
promtool tests it (alerts_test.yml), and its groups become the PrometheusRule's
spec.groups here unchanged. tests/test_kubernetes.py fails when the manifest differs
from what this script writes, so the two cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "compose" / "prometheus" / "alerts.yml"
TARGET = ROOT / "deploy" / "kubernetes" / "components" / "prometheus-operator" / "prometheusrule.yaml"

HEADER = """\
# Written by deploy/kubernetes/prometheusrule.py from compose/prometheus/alerts.yml:
# edit the rules there, then run the script (tests/test_kubernetes.py checks they match).
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer PromQL expressions) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object for a Prometheus rule file's content."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "streams-sched",
            "labels": {"app.kubernetes.io/component": "alerts"},
        },
        "spec": {"groups": rules["groups"]},
    }


def render(source: Path = SOURCE) -> str:
    """The manifest's text, as this script writes it."""
    rules = yaml.safe_load(source.read_text(encoding="utf-8"))
    body = yaml.dump(prometheus_rule(rules), Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python {Path(__file__).relative_to(ROOT)}", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
