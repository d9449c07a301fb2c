"""kvgate: an OpenAI-compatible gateway that knows what every LLM request cost, and why.

    api/         thin routers, one per surface: inference (the hot path), billing, admin,
                 health, and the OpenAPI document
    serving/     the request path for every backend: context, one failover loop, one
                 record mapping, one usage shape; a module per backend kind
    routing/     a leaf: prompts to salted block hashes, the index of who holds what,
                 placement, the pure policy, the fleet (health, load, KV events)
    upstream/    transports: the pooled aiohttp session, SSE splitting, litellm (lazily)
    accounting/  records, the ledger (price → cost), the journal and the recorder
    db/          the only package that imports SQLAlchemy: models, sessions, statements,
                 figures, look-ups, the writer
    tools/       beside the service, depending on it and never the reverse: sim, replay,
                 cachetest, demo
    app.py       create_app(settings)      config.py   Settings (the only reader of the
    cli.py       the ``kvgate`` command                 environment) and kvgate.yaml

Dependencies point one way: api → serving → routing / upstream / accounting → pricing;
db below accounting (tests/test_layout.py holds the rules).
"""
