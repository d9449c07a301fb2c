"""`kvgate cachetest` against kvgate in front of two `kvgate sim` replicas: the figures are
the ones the simulated cache must produce, the isolated tenants pass the audit, and the
tenants the operator put in one sharing group are caught from timing alone."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.cachetest.conftest import BLOCK_SIZE, CAPACITY_BLOCKS, MODEL, cachetest
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e

WORDS = 1024  # the quick plan's prompt length
PROMPT_TOKENS = WORDS + 2  # the sim's chat template: "<|user|>\n" ... "<|assistant|>\n"
# Catalog price of the model in force now (pricing/catalog/demo.yaml, from 2026-07-01).
INPUT, CACHE_READ, OUTPUT = Decimal("0.15"), Decimal("0.015"), Decimal("0.45")


def report(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "report.json").read_text())  # type: ignore[no-any-return]


def failed_audit(directory: Path) -> Any:
    """What a failed run's isolation stage found, for the assertion message."""
    try:
        stage = report(directory)["stages"]["isolation"]
    except (OSError, KeyError, ValueError):
        return None
    return {k: stage.get(k) for k in ("evidence", "audit", "confirmation", "ttft_s")}


def nano(tokens: int, rate: Decimal) -> Decimal:
    return (tokens * rate / 1_000_000).quantize(Decimal("0.000000001"))


def test_the_quick_plan_against_the_fleet(fleet: Stack, tmp_path: Path) -> None:
    """Every stage, isolated tenants, kvgate's own statement for the price; under 3 minutes.

    The target is the base URL an openai client is given (``/v1``, here with a slash)."""
    run = cachetest(
        "--target", fleet.url + "/v1/",
        "--key", fleet.keys["alpha"],
        "--second-key", fleet.keys["beta"],
        "--model", MODEL,
        "--plan", "quick",
        "--report", str(tmp_path),
        "--seed", "42",
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout, failed_audit(tmp_path))
    assert run.wall_s < 180
    assert "cachetest [" in run.stderr and "isolation" in run.stderr
    data = report(tmp_path)
    assert data["kvgate_target"] is True
    assert (data["block_size"], data["block_size_source"]) == (16, "default")

    # 1. Cold, nothing cached; warm, every full block but the last prompt token's.
    cold_warm = data["stages"]["cold-warm"]
    for row in cold_warm["requests"]:
        assert row["prompt_tokens"] == PROMPT_TOKENS
        assert row["cached_tokens"] == (0 if row["pass"] == "cold" else 1024)
    assert cold_warm["warm"]["ttft_s"]["p50"] < cold_warm["cold"]["ttft_s"]["p50"] / 2

    # 2. Exact cached tokens for each step: the head token "<|user|>\n" plus the shared
    # words (moved to mid-block), in full blocks of 16; all of it but the last block at 100%.
    steps = {s["percent"]: s for s in data["stages"]["partial"]["steps"]}
    assert {k: s["shared_words"] for k, s in steps.items()} == {
        0: 0, 25: 264, 50: 520, 75: 776, 100: 1024,
    }  # fmt: skip
    assert {k: s["cached_tokens"] for k, s in steps.items()} == {
        0: [0], 25: [256], 50: [512], 75: [768], 100: [1024],
    }  # fmt: skip
    assert all(s["expected_cached_tokens"] == s["cached_tokens"] for s in steps.values())
    assert data["stages"]["partial"]["all_match"] is True

    # 3. Concurrency: every level answered, the shared prefix hit.
    levels = data["stages"]["concurrency"]["levels"]
    assert [lv["clients"] for lv in levels] == [1, 4, 16, 64]
    assert [lv["requests"] for lv in levels] == [2, 8, 32, 128]
    assert all(lv["errors"] == 0 for lv in levels)
    assert levels[-1]["token_hit_rate"] > 0.5

    # 4. Eviction: a working set one replica's cache holds is reused in full wherever the
    # router puts it; reuse is gone only past one replica's cache (where past that it goes
    # depends on how the router split the prompts between the two).
    eviction = data["stages"]["eviction"]
    replica_tokens = CAPACITY_BLOCKS * BLOCK_SIZE
    for size in eviction["sizes"]:
        if size["tokens"] <= replica_tokens:
            assert size["hit_rate"] == 1024 / PROMPT_TOKENS, size
    gone = next(s for s in eviction["sizes"] if s["gone"])
    assert gone["hit_rate"] < 0.1 * 1024 / PROMPT_TOKENS
    assert eviction["reuse_gone_tokens"] == gone["tokens"] > replica_tokens
    assert eviction["last_reuse_tokens"] < gone["tokens"]

    # 5. Isolated tenants: nothing cached across keys, no timing evidence, yet the control
    # shows the cache is visible in TTFT.
    isolation = data["stages"]["isolation"]
    assert isolation["verdict"] == "no evidence of sharing"
    assert isolation["leaked_cached_tokens"] == 0
    assert isolation["evidence"] == {"usage": False, "timing": False}
    assert isolation["control_detectable"] is True
    assert all(row["cached_tokens"] == 0 for row in isolation["requests"]["warmed"])
    assert data["exit_status"] == 0

    # 6. Summary priced from kvgate's statement, which agrees with the reported usage.
    assert data["price_source"] == "kvgate statement"
    assert data["price_usd_per_million"] == {
        "input": "0.15",
        "cache_read": "0.015",
        "output": "0.45",
    }
    summary = data["summary"]
    cold_cost = 8 * nano(PROMPT_TOKENS, INPUT)
    warm_cost = 8 * (nano(2, INPUT) + nano(1024, CACHE_READ))
    assert Decimal(summary["input_cost_usd"]) == cold_cost + warm_cost
    assert Decimal(summary["uncached_input_cost_usd"]) == 2 * cold_cost
    output = 16 * nano(4, OUTPUT)
    assert Decimal(summary["cost_per_completed_usd"]) == (
        (cold_cost + warm_cost + output) / 16
    ).quantize(Decimal("0.000000001"))
    assert summary["token_hit_rate"] == 8 * 1024 / (16 * PROMPT_TOKENS)
    assert summary["ttft_change_warm_vs_cold"] < -0.5
    billed = summary["kvgate_statement"]
    assert billed["matches_usage"] is True
    assert billed["requests"] == summary["first_key_requests"]["requests"]

    for name in ("report.md", "ttft_cold_warm.png", "partial.png", "eviction.png", "audit.png"):
        assert (tmp_path / name).stat().st_size > 0
    markdown = (tmp_path / "report.md").read_text()
    assert "**Isolation passed: no evidence of sharing.**" in markdown
    assert "| 25% | 264 | 256 | 256 | yes |" in markdown


def test_an_operator_sharing_group_is_caught_from_timing_alone(
    fleet: Stack, tmp_path: Path
) -> None:
    """carol and dave share a cache group; the auditor never sees a cached-token count."""
    run = cachetest(
        "--target", fleet.url,
        "--key", fleet.keys["carol"],
        "--second-key", fleet.keys["dave"],
        "--model", MODEL,
        "--stages", "isolation",
        "--audit-timing-only",
        "--report", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-3000:]
    assert "isolation: cache shared across keys" in run.stdout
    isolation = report(tmp_path)["stages"]["isolation"]
    assert isolation["verdict"] == "cache shared across keys"
    assert isolation["evidence"] == {"usage": None, "timing": True}
    assert isolation["leaked_cached_tokens"] is None
    assert all("cached_tokens" not in row for row in isolation["requests"]["warmed"])
    assert all("cached_tokens" not in row for row in isolation["requests"]["fresh"])
    audit = isolation["audit"]
    assert audit["p_value"] < 0.01 and audit["rank_biserial"] >= 0.5
    # Confirmed on new prompts before it was called.
    again = isolation["confirmation"]
    assert again["audit"]["p_value"] < 0.01 and again["audit"]["rank_biserial"] >= 0.5
    assert len(again["requests"]["warmed"]) == len(isolation["requests"]["warmed"])
    markdown = (tmp_path / "report.md").read_text()
    assert "**Isolation FAILED: cache shared across keys.**" in markdown
    assert "| confirmation: warmed (x) vs fresh (y) | 16 / 16 |" in markdown
    assert "- confirmation: significant too" in markdown


def test_isolated_tenants_pass_the_timing_only_audit_too(fleet: Stack, tmp_path: Path) -> None:
    run = cachetest(
        "--target", fleet.url,
        "--key", fleet.keys["alpha"],
        "--second-key", fleet.keys["beta"],
        "--model", MODEL,
        "--stages", "isolation",
        "--audit-timing-only",
        "--report", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert report(tmp_path)["stages"]["isolation"]["verdict"] == "no evidence of sharing"
