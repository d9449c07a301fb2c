"""`kvgate prices import-litellm`: dated entries from litellm's bundled map, earlier ones kept."""

from datetime import date
from decimal import Decimal

from gateway.db import crud
from gateway.db.session import make_engine, session_factory
from pricing.book import LongContext, PriceBook, Rates, price_from_mapping
from pricing.litellm_map import plan_import, prices_from_map
from tests.support.processes import gateway_env, kvgate

D = Decimal
DAY = date(2026, 11, 29)
MAP = {
    "claude-x": {
        "mode": "chat",
        "input_cost_per_token": 3e-06,
        "output_cost_per_token": 1.5e-05,
        "cache_read_input_token_cost": 3e-07,
        "cache_creation_input_token_cost": 3.75e-06,
        "cache_creation_input_token_cost_above_1hr": 6e-06,
        "input_cost_per_token_batches": 1.5e-06,
        "output_cost_per_token_batches": 7.5e-06,
    },
    "gemini/x": {
        "mode": "chat",
        "input_cost_per_token": 1.25e-06,
        "output_cost_per_token": 1e-05,
        "cache_read_input_token_cost": 1.25e-07,
        "input_cost_per_token_above_200k_tokens": 2.5e-06,
        "output_cost_per_token_above_200k_tokens": 1.5e-05,
        "cache_read_input_token_cost_above_200k_tokens": 2.5e-07,
    },
    "free-reads": {
        "input_cost_per_token": 1e-06,
        "output_cost_per_token": 2e-06,
        "cache_read_input_token_cost": 0,
    },
    "no-cache-rate": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06},
    "embedder": {"mode": "embedding", "input_cost_per_token": 1e-07, "output_cost_per_token": 0},
    "image-only": {"mode": "chat", "output_cost_per_image": 0.04},
}


def test_map_entries_become_exact_per_million_rates() -> None:
    prices = {p.model: p for p in prices_from_map(MAP, captured_on=DAY, source="litellm 9.9")}
    assert sorted(prices) == ["claude-x", "free-reads", "gemini/x", "no-cache-rate"]
    claude = prices["claude-x"]
    assert claude.base == Rates(
        input=D("3"),
        cache_read=D("0.3"),
        output=D("15"),
        cache_write=D("3.75"),
        cache_write_1h=D("6"),
    )
    # The batch tier lists input and output; its cache rates are the base ones.
    assert claude.tiers == (
        (
            "batch",
            Rates(
                input=D("1.5"),
                cache_read=D("0.3"),
                output=D("7.5"),
                cache_write=D("3.75"),
                cache_write_1h=D("6"),
            ),
        ),
    )
    assert (claude.source, claude.captured_on, claude.id) == (
        "litellm 9.9",
        DAY,
        "claude-x@2026-11-29T00:00:00Z",
    )
    assert prices["gemini/x"].long_context == LongContext(
        above=200_000, rates=Rates(input=D("2.5"), cache_read=D("0.25"), output=D("15"))
    )
    assert prices["free-reads"].cache_read == D("0")
    assert prices["no-cache-rate"].cache_read == D("1")  # no discount known: billed as input


def test_only_changes_are_added_and_earlier_entries_stay() -> None:
    earlier = price_from_mapping(
        {
            "model": "claude-x",
            "effective_from": "2026-01-01",
            "input": "3",
            "cache_read": "0.30",
            "cache_write": "3.75",
            "cache_write_1h": "6",
            "output": "15",
            "tiers": {
                "batch": {
                    "input": "1.5",
                    "cache_read": "0.3",
                    "output": "7.5",
                    "cache_write": "3.75",
                    "cache_write_1h": "6",
                }
            },
        }
    )
    changed = price_from_mapping(
        {
            "model": "gemini/x",
            "effective_from": "2026-01-01",
            "input": "1",
            "cache_read": "0.1",
            "output": "9",
        }
    )
    same_day = price_from_mapping(
        {
            "model": "free-reads",
            "effective_from": DAY,
            "input": "5",
            "cache_read": "5",
            "output": "5",
        }
    )
    plan = plan_import(
        PriceBook([earlier, changed, same_day]),
        prices_from_map(MAP, captured_on=DAY, source="litellm 9.9"),
    )
    assert [p.id for p in plan.add] == [
        "gemini/x@2026-11-29T00:00:00Z",
        "no-cache-rate@2026-11-29T00:00:00Z",
    ]
    assert plan.unchanged == ["claude-x@2026-11-29T00:00:00Z"]
    assert plan.conflicts == ["free-reads@2026-11-29T00:00:00Z"]


def test_the_cli_imports_from_the_installed_litellm_once(database_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = gateway_env(database_url, tmp_path / "journal")
    args = (
        "prices",
        "import-litellm",
        "--captured-on",
        "2026-11-29",
        "--match",
        "claude-sonnet-4-5",
    )
    first = kvgate(*args, env=env).stdout
    again = kvgate(*args, env=env).stdout
    assert first.endswith("added 1, unchanged 0, conflicts 0\n")
    assert again.endswith("added 0, unchanged 1, conflicts 0\n")
    engine = make_engine(database_url)
    with session_factory(engine)() as session:
        [price] = crud.price_book(session).entries("claude-sonnet-4-5")
    engine.dispose()
    assert price.source.startswith("litellm 1.110.")
    assert (
        price.input,
        price.cache_read,
        price.cache_write,
        price.cache_write_1h,
        price.output,
    ) == (D(3), D("0.3"), D("3.75"), D(6), D(15))
