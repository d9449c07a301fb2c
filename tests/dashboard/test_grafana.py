"""dashboard/grafana: the Grafana dashboard for the gateway's Prometheus metrics.

Every series a panel queries exists in a live gateway's ``/metrics`` once it has served
traffic (a stream, a refusal, a replica), the panels cover what an operator watches, and
the provisioning files point Grafana at the Prometheus docker-compose.yml starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import vllm
from tests.support.stack import SIM_MODEL, Stack, running_stack

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "dashboard" / "grafana"
DASHBOARD = json.loads((GRAFANA / "kvgate.json").read_text())
PANELS = DASHBOARD["panels"]
METRIC = re.compile(r"\b(kvgate_[a-z0-9_]+)")
ADMIN = "grafana-test-admin"


def queried() -> set[str]:
    """Every kvgate series name a panel's or a variable's query names."""
    exprs = [t["expr"] for p in PANELS for t in p["targets"]]
    exprs += [v["definition"] for v in DASHBOARD["templating"]["list"]]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def test_the_panels_cover_what_an_operator_watches() -> None:
    titles = [p["title"] for p in PANELS]
    assert titles == [
        "Request rate by status",
        "Request rate by endpoint",
        "Latency p50 / p99",
        "Time to first token p50 / p99",
        "Tokens by class",
        "Cost rate",
        "Unpriced requests",
        "Token hit rate vs ceiling",
        "Recorder backlog",
        "Journal sync lag",
        "Journal size",
        "Database up",
        "Replica health",
        "Replica in flight",
        "Spend refusals",
        "Client disconnects",
    ]
    assert len({p["id"] for p in PANELS}) == len(PANELS)
    for panel in PANELS:
        assert panel["description"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["datasource"]["uid"] == "kvgate-prometheus"
        # No two panels overlap on Grafana's 24-column grid.
    cells = [
        (x, y)
        for p in PANELS
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)) and max(x for x, _ in cells) < 24


def test_provisioning_points_grafana_at_the_composed_prometheus() -> None:
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    [datasource] = source["datasources"]
    assert (datasource["uid"], datasource["url"]) == ("kvgate-prometheus", "http://prometheus:9090")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"]}
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/kvgate.yaml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    assert mounts[f"{folder}/kvgate.json"] == "./dashboard/grafana/kvgate.json"
    assert mounts["/etc/grafana/provisioning"] == "./dashboard/grafana/provisioning"
    scrape = yaml.safe_load(compose["configs"]["prometheus"]["content"])
    [job] = scrape["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["gateway:8000", "gateway-2:8000"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("grafana")
    with running_stack(
        tmp,
        f"sqlite:///{tmp / 'kvgate.db'}",
        tenants=("alpha", "limited"),
        KVGATE_ADMIN_TOKEN=ADMIN,
    ) as stack:
        [sim] = stack.start_sims(1)
        stack.configure([vllm(SIM_MODEL, [sim.url])])
        stack.start_gateway()
        yield stack


@pytest.mark.e2e
def test_every_series_a_panel_queries_is_in_a_live_gateways_metrics(stack: Stack) -> None:
    client = stack.client("alpha")
    ask = [{"role": "user", "content": "What does the panel show? " * 20}]  # a block or more
    for _ in range(2):  # the repeat reads the cache
        client.chat.completions.create(model=SIM_MODEL, messages=ask, max_tokens=4)
    for _ in client.chat.completions.create(
        model=SIM_MODEL, messages=ask, max_tokens=4, stream=True
    ):
        pass
    httpx.post(
        stack.url + "/v1/admin/budgets",
        json={"scope": "tenant:limited", "limit": "0", "period": "day"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).raise_for_status()
    with pytest.raises(openai.APIStatusError):
        stack.client("limited").chat.completions.create(model=SIM_MODEL, messages=ask)
    exposed = httpx.get(stack.url + "/metrics").text
    samples = {
        sample.name
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
    }
    wanted = queried()
    assert len(wanted) >= 18
    assert wanted - samples == set()
    # The hit-rate panel's series count the same requests: achieved never above the ceiling's
    # denominator, and the ceiling was computed for these vLLM-path requests.
    values: dict[tuple[str, str | None], float] = {}  # summed over endpoints, as the panel is
    for family in text_string_to_metric_families(exposed):
        for s in family.samples:
            key = (s.name, s.labels.get("model"))
            values[key] = values.get(key, 0.0) + s.value
    prompt = values[("kvgate_ceiling_prompt_tokens_total", SIM_MODEL)]
    read = values[("kvgate_ceiling_cache_read_tokens_total", SIM_MODEL)]
    ceiling = values[("kvgate_ceiling_cached_tokens_total", SIM_MODEL)]
    assert 0 < read <= ceiling < prompt
