"""The prefix-cache model shared by the simulated replica and the replay."""

from gateway.tools.sim.cache import PrefixCache


def test_a_request_hits_only_the_leading_run_of_held_blocks() -> None:
    cache = PrefixCache(8)
    cache.release(cache.admit(["a", "b", "c"]).pinned)
    assert cache.match(["a", "b", "c", "d"]) == 3
    assert cache.match(["a", "x", "c"]) == 1
    assert cache.match(["x", "a"]) == 0


def test_admission_reports_hits_stores_and_evictions() -> None:
    cache = PrefixCache(4)
    first = cache.admit([1, 2, 3])
    assert (first.hit_blocks, first.stored, first.evicted) == (0, [1, 2, 3], [])
    cache.release(first.pinned)
    second = cache.admit([1, 2, 9, 10])
    # Block 3 was freed last-in-request-first, so it is the first evicted.
    assert (second.hit_blocks, second.stored, second.evicted) == (2, [9, 10], [3])
    assert len(cache) == 4


def test_within_a_request_the_tail_is_evicted_before_the_head() -> None:
    cache = PrefixCache(3)
    cache.release(cache.admit(["h", "m", "t"]).pinned)
    admission = cache.admit(["new"])
    assert admission.evicted == ["t"]
    assert cache.match(["h", "m"]) == 2


def test_pinned_blocks_are_never_evicted() -> None:
    cache = PrefixCache(2)
    running = cache.admit(["a", "b"])
    other = cache.admit(["c"])
    assert other.stored == [] and other.pinned == [] and other.evicted == []
    assert cache.match(["a", "b"]) == 2
    cache.release(running.pinned)
    assert cache.admit(["c"]).evicted == ["b"]


def test_shared_blocks_are_reference_counted() -> None:
    cache = PrefixCache(3)
    one = cache.admit(["s", "x"])
    two = cache.admit(["s", "y"])
    assert two.hit_blocks == 1
    cache.release(one.pinned)
    # "s" is still pinned by the second request; only "x" is free.
    assert cache.admit(["z", "w"]).evicted == ["x"]
    cache.release(two.pinned)


def test_lru_order_is_by_last_release() -> None:
    cache = PrefixCache(2)
    cache.release(cache.admit(["a"]).pinned)
    cache.release(cache.admit(["b"]).pinned)
    cache.release(cache.admit(["a"]).pinned)  # a is now the most recently used
    assert cache.admit(["c"]).evicted == ["b"]


def test_clear_drops_free_blocks_and_keeps_pinned_ones() -> None:
    cache = PrefixCache(4)
    cache.release(cache.admit(["a"]).pinned)
    running = cache.admit(["b"])
    assert cache.clear() == ["a"]
    assert "b" in cache and "a" not in cache
    assert cache.usage == 0.25
    cache.release(running.pinned)
