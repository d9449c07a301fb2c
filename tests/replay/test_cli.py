"""``replay`` as a typer command: tables on stdout, a report directory, bad options refused."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer
from typer.testing import CliRunner

from gateway.tools.replay.cli import replay

TINY_FLEET = [
    "--replicas",
    "2",
    "--capacity-blocks",
    "10",
    "--block-tokens",
    "4",
    "--prefill-tokens-per-s",
    "100",
    "--decode-tokens-per-s",
    "10",
]


def app() -> typer.Typer:
    application = typer.Typer()
    application.command()(replay)
    return application


def test_replay_prints_ceilings_and_a_table_per_policy(tiny_path: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app(),
        [
            str(tiny_path),
            *TINY_FLEET,
            "--policies",
            "kv-aware,round-robin",
            "--report",
            str(tmp_path / "out"),
            "--price",
            "input=1,cache_read=0.1,output=2",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "infinite-cache ceiling: 45.45%" in lines
    assert "pooled ceiling (2 x 10 blocks in one LRU cache): 45.45%" in lines
    assert "router index: approximate" in lines
    assert any(line.startswith("| kv-aware | 45.45% | 100.0% |") for line in lines)
    assert any(line.startswith("| round-robin | 27.27% | 60.0% |") for line in lines)
    data = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    assert sorted(data["policies"]) == ["kv-aware", "round-robin"]


def test_limit_and_exact_index(tiny_path: Path) -> None:
    result = CliRunner().invoke(
        app(),
        [str(tiny_path), *TINY_FLEET, "--limit", "2", "--index", "exact", "--policies", "kv-aware"],
    )
    assert result.exit_code == 0, result.output
    assert "requests: 2" in result.output
    assert "router index: exact" in result.output


def test_bad_options_are_refused(tiny_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app(), [str(tiny_path), "--policies", "kv-aware,fastest"])
    assert result.exit_code == 2
    assert "unknown fastest" in result.output
    result = runner.invoke(app(), [str(tiny_path), "--price", "input=1"])
    assert result.exit_code == 2
    result = runner.invoke(app(), [str(tiny_path), "--target", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "needs an API key" in result.output
