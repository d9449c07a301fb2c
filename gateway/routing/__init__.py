"""Routing: which vLLM replica serves a request, and what the router believes it holds.

A leaf: it takes plain values (a prompt as `inputs.ChatPrompt` / `inputs.TextPrompt`, a
`fleet_config.FleetConfig` built at start, an injected `inputs.PromptTokenizer`) and
imports nothing else of the gateway (tests/routing/test_leaf.py).

    inputs        what routing is given of a prompt; what it asks of a tokenizer
    prompts       prompt → chained, salted block hashes (text chunks, or the replicas'
                  own token blocks: tokens, vllm_blocks)
    index, exact  which replica holds which blocks: learned (approximate) or from KV
                  events (kv_events, kv_wire), by tier (tiers: media, weights)
    predicted     placements believed until the KV events confirm them (predict on route)
    placement     views, in-flight and queued-prefill accounting, capacity, prediction,
                  hot-prefix marks, learning: the code the live fleet and `kvgate replay`
                  both run
    policy        the pure choose() over a snapshot
    fleet         one deployment live: health, /metrics (load), KV event consumers,
                  the ceiling (ceiling), peer workers (peers)
    fleet_config  the fleet's configuration, plain values
"""
