"""`kvgate gpu-cost set | list | report` end to end: dated entries (replicas from the
deployments file by default), the report's table and JSON against the hand computation of
``tests/support/serving.py``, and clear refusals (exit 2)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from gateway.db.session import make_engine
from tests.factories import config_file, litellm, vllm
from tests.support.serving import EXPECTED, IDLE_COST, serving_world


@pytest.fixture
def ids(database_url: str) -> Iterator[dict[str, str]]:
    engine = make_engine(database_url)
    yield serving_world(engine, costs=False)
    engine.dispose()


@pytest.fixture
def env(database_url: str, ids: dict[str, str], tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    config = config_file(
        tmp_path / "kvgate.yaml",
        [vllm("m"), litellm("hosted", "openai/gpt-4.1")],  # m: two replicas
    )
    return {**environment, "KVGATE_DATABASE_URL": database_url, "KVGATE_CONFIG": str(config)}


def kvgate(env: dict[str, str], *arguments: str) -> Any:
    return CliRunner().invoke(app, ["gpu-cost", *arguments], env={**env, "COLUMNS": "200"})


def set_both(env: dict[str, str]) -> None:
    first = kvgate(
        env,
        "set",
        "--deployment",
        "m",
        "--per-replica-hour",
        "2.50",
        "--effective-from",
        "2026-07-01T10:00Z",
    )
    assert first.exit_code == 0, first.output
    assert first.output == (
        "m from 2026-07-01T10:00Z: 2.50 USD per replica-hour x 2 replica(s) = 5.000000000 an hour, "
        "decode weight 4: added\n"
    )
    second = kvgate(
        env,
        *("set", "--deployment", "m", "--per-replica-hour", "3", "--replicas", "1"),
        *("--decode-weight", "2", "--effective-from", "2026-07-01 12:00"),
    )
    assert second.exit_code == 0, second.output


def test_set_then_list_shows_dated_entries_with_the_configured_replicas(
    env: dict[str, str],
) -> None:
    set_both(env)
    listed = kvgate(env, "list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines() == [
        "deployment\teffective_from\tper_replica_hour\treplicas\thour_cost\tdecode_weight",
        "m\t2026-07-01T10:00Z\t2.500000000\t2\t5.000000000\t4",
        "m\t2026-07-01T12:00Z\t3.000000000\t1\t3.000000000\t2",
    ]
    again = kvgate(
        env, "set", "--deployment", "m", "--per-replica-hour", "2.5", "--effective-from",
        "2026-07-01T10:00:00+00:00",
    )  # fmt: skip
    assert again.exit_code == 0 and again.output.endswith(": already present\n"), again.output


def test_report_table_and_json_match_the_hand_computation(
    env: dict[str, str], ids: dict[str, str]
) -> None:
    set_both(env)
    table = kvgate(env, "report", "--since", "2026-07-01T10:00Z", "--until", "2026-07-01T13:00Z")
    assert table.exit_code == 0, table.output
    assert table.output.splitlines() == [
        "deployment\ttenant\thours\trequests\tcost_to_serve\tcharged\tmargin\tcache_saving",
        *(
            f"m\t{e.tenant}\t{e.hours}\t{e.requests}\t{e.cost_to_serve:f}\t{e.charged:f}"
            f"\t{e.margin:f}\t{e.cache_saving:f}"
            for e in EXPECTED
        ),
        f"m\t(idle)\t1\t0\t{IDLE_COST}\t0.000000000\t-{IDLE_COST}\t0.000000000",
    ]
    assert "\ta\t2\t2\t4.985148515\t0.000255750\t-4.984892765\t8.242574257" in table.output
    found = kvgate(
        env, "report", "--since", "2026-07-01T10:00Z", "--until", "2026-07-01T13:00Z",
        "--format", "json",
    )  # fmt: skip
    assert found.exit_code == 0, found.output
    document = json.loads(found.output)
    assert (document["since"], document["until"]) == (
        "2026-07-01T10:00:00Z",
        "2026-07-01T13:00:00Z",
    )
    assert document["idle"] == [{"deployment": "m", "hours": 1, "cost": "5.000000000"}]
    assert [
        (line["tenant"], line["tenant_id"], line["cost_to_serve"], line["charged"], line["margin"])
        for line in document["lines"]
    ] == [
        (e.tenant, ids[e.tenant], f"{e.cost_to_serve:f}", f"{e.charged:f}", f"{e.margin:f}")
        for e in EXPECTED
    ]
    assert document["lines"][0]["cache_saving"] == "8.242574257"
    assert document["lines"][0]["uncached_tokens"] == 1100


def test_report_without_since_starts_at_the_first_entry(env: dict[str, str]) -> None:
    set_both(env)
    table = kvgate(env, "report", "--until", "2026-07-01T12:00Z")
    # 10:00 and 11:00 alone: r5 at 9:30 is before the first entry.
    assert table.output.splitlines()[1:] == [
        "m\ta\t1\t1\t3.500000000\t0.000240000\t-3.499760000\t7.500000000",
        "m\tb\t1\t1\t1.500000000\t0.000086250\t-1.499913750\t0.000000000",
        "m\t(idle)\t1\t0\t5.000000000\t0.000000000\t-5.000000000\t0.000000000",
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--deployment", "m", "--effective-from", "2026-07-01T10:30Z"), "whole UTC hour"),
        (("--deployment", "nope", "--effective-from", "now"), "not in the deployments file"),
        (("--deployment", "hosted", "--effective-from", "now"), "is hosted"),
        (("--deployment", "m", "--effective-from", "now", "--decode-weight", "0"), "decode"),
    ],
)
def test_set_refuses_what_it_cannot_charge_by_the_hour(
    env: dict[str, str], arguments: tuple[str, ...], message: str
) -> None:
    result = kvgate(env, "set", "--per-replica-hour", "1", *arguments)
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("cost", "replicas", "message"),
    [
        ("1e30", "1", "the cost per replica-hour is 0 or more, under 1000000000"),
        ("1000000000", "1", "the cost per replica-hour is 0 or more, under 1000000000"),
        ("1", "99999999999", "charged for 1 to 1000000 replicas, not 99999999999"),
        ("1000", "1000000", "an hour of the deployment costs under 1000000000"),
    ],
)
def test_set_refuses_what_the_columns_cannot_hold(
    env: dict[str, str], cost: str, replicas: str, message: str
) -> None:
    result = kvgate(
        env, "set", "--deployment", "m", "--per-replica-hour", cost, "--effective-from", "now",
        "--replicas", replicas,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_an_entry_is_never_edited(env: dict[str, str]) -> None:
    set_both(env)
    result = kvgate(
        env, "set", "--deployment", "m", "--per-replica-hour", "2.60", "--effective-from",
        "2026-07-01T10:00Z",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "already has a GPU cost from 2026-07-01T10:00Z with other figures" in result.output
