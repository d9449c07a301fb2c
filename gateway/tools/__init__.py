"""Tools beside the service, depending on it and never the reverse.

sim/        ``kvgate sim``: a vLLM-faithful simulated replica (prefix cache, KV events,
            metrics, timing)
replay/     ``kvgate replay``: trace replay through the gateway's own placement code
cachetest/  ``kvgate cachetest``: the cache test plan against any endpoint
demo.py     ``kvgate demo``: gateway, simulated replicas, dashboard and a workload
workload.py the demo's traffic
lcg.py      the word draws the simulated replica, the test plan and live replay share
totals.py   a tenant's statement totals, read and subtracted (cachetest's and replay's bills)
"""
