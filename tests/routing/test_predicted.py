"""Predict on route: a placement on a replica followed by its KV events is believed until
the events confirm it, the replica's report contradicts it, or its time runs out; so a
burst of siblings co-locates before the first event. And hot prefixes: a prefix shared by
requests in flight is spread by cost, a conversation's own kept."""

from __future__ import annotations

from gateway.routing.exact import RoutingIndex
from gateway.routing.index import ApproximateIndex
from gateway.routing.placement import Placer, Replica, make_route, mark_of, marks
from gateway.routing.predicted import PredictedIndex
from gateway.routing.prompts import Prompt

BLOCK = 16


def exact_index(*names: str, ttl_s: float = 5.0) -> RoutingIndex:
    index = RoutingIndex(ApproximateIndex(1000), predicted=PredictedIndex(ttl_s))
    for name in names:
        index.set_fresh(name, True)
    return index


def test_a_prediction_holds_until_its_time_runs_out() -> None:
    predicted = PredictedIndex(ttl_s=5.0)
    predicted.predict("a", [1, 2, 3], now=0.0)
    predicted.predict("b", [1, 2], now=1.0)
    assert predicted.match_all([1, 2, 3, 4]) == {"a": 3, "b": 2}
    predicted.predict("a", [1], now=3.0)  # predicted again: lives on past the first's end
    predicted.expire(5.0)
    assert predicted.match_all([1, 2, 3]) == {"a": 1, "b": 2}
    predicted.expire(8.0)
    assert predicted.match_all([1]) == {}
    assert len(predicted) == 0 and not predicted


def test_the_router_matches_exact_holdings_and_predictions_as_one_run() -> None:
    index = exact_index("a", "b")
    index.block_stored("a", [1, 2], medium="GPU")
    index.record("a", [1, 2, 3, 4, 5], now=0.0, start=2)  # predicts 3, 4, 5 only
    index.block_stored("a", [6], medium="GPU")  # held after the predicted run
    assert index.match_all([1, 2, 3, 4, 5, 6, 7]) == {"a": 6}
    assert len(index.predicted) == 3
    index.block_stored("a", [3, 4])  # the events confirm: predictions no more
    assert len(index.predicted) == 1
    assert index.match("a", [1, 2, 3, 4, 5, 6]) == 6
    index.correct("a", [1, 2, 3, 4, 5], 4, predicted_blocks=5)  # its report: 5 was not there
    assert index.match("a", [1, 2, 3, 4, 5, 6]) == 4
    assert len(index.predicted) == 0


def test_predictions_are_only_for_replicas_followed_by_events_and_go_with_a_reset() -> None:
    index = exact_index("a")
    index.record("b", [1, 2], now=0.0)  # b has no event stream: the approximate index learns
    assert len(index.predicted) == 0
    index.record("a", [7, 8], now=0.0)
    assert index.match_all([7, 8]) == {"a": 2}
    index.all_blocks_cleared("a")
    assert index.match_all([7, 8]) == {}
    index.record("a", [7, 8], now=0.0)
    index.forget("a")
    assert len(index.predicted) == 0


def burst(placer: Placer, count: int) -> list[str]:
    """``count`` requests with one new 250-block prefix and their own last block, placed
    a millisecond apart, before any event or reply."""
    chosen = []
    for n in range(count):
        prompt = Prompt([*range(1, 251), 10_000 + n], 251 * BLOCK, BLOCK, True)
        route = make_route(prompt, request_id=f"r{n}", interaction_id=f"r{n}")
        chosen.append(placer.place(route, now=n / 1000).replica.name)
    return chosen


def test_a_burst_of_siblings_lands_together_on_a_fleet_followed_by_events() -> None:
    names = ("a", "b", "c", "d")
    placer = Placer([Replica(n) for n in names], exact_index(*names), name="m")
    assert len(set(burst(placer, 16))) == 1
    # Without predictions (each expired before the next sibling) they scatter.
    scattering = Placer([Replica(n) for n in names], exact_index(*names, ttl_s=1e-6), name="m")
    assert len(set(burst(scattering, 16))) == 4


def test_a_hot_prefix_spreads_by_cost_and_a_conversation_stays() -> None:
    """One replica holds a 400-block prefix (6,400 tokens) and has 20,000 tokens of
    prefill queued. A request whose prefix another request in flight shares is held to the
    imbalance limit (1.25 x the mean load + 4,096): 9,665 tokens over it cost more than
    the prefix saves, so it goes to the cheapest other replica. The same request with a
    prefix of its own is held to the affinity limit (2 x the mean + 65,536) and stays."""
    names = ("a", "b", "c", "d")
    prefix = list(range(1, 401))

    def placer_with_load(shared_in_flight: bool) -> Placer:
        placer = Placer([Replica(n) for n in names], RoutingIndex(ApproximateIndex(1000)))
        placer.index.record("a", prefix)
        placer.replicas[0].queued_prefill_tokens = 20_000
        if shared_in_flight:
            sibling = Prompt([*prefix, 500], 401 * BLOCK, BLOCK, True)
            placer.place(make_route(sibling, request_id="s", interaction_id="s"), now=0.0)
        return placer

    prompt = Prompt([*prefix, 900], 401 * BLOCK + 8, BLOCK, True)
    route = make_route(prompt, request_id="r", interaction_id="r")
    assert placer_with_load(shared_in_flight=True).place(route, now=0.0).replica.name != "a"
    assert placer_with_load(shared_in_flight=False).place(route, now=0.0).replica.name == "a"


def test_marks_fall_at_positions_0_1_3_7_and_the_deepest_inside_a_run_is_found() -> None:
    hashes = list(range(100, 140))
    assert marks(hashes) == (100, 101, 103, 107, 115, 131)
    assert [mark_of(hashes, depth) for depth in (0, 1, 2, 4, 16, 17, 40)] == [
        None,
        100,
        101,
        103,
        115,
        115,
        131,
    ]
