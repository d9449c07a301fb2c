"""``kvgate cachetest``: the cache test plan as one command against any OpenAI-compatible
endpoint (kvgate, a vLLM server, a hosted provider), with a cross-tenant leak audit.

Stages (each can run alone): cold vs warm (`cold_warm`), partial matches (`partial`),
concurrency (`concurrency`), eviction (`eviction`), tenant isolation (`isolation`), and
the summary (`summary`). `runner` runs them over one `client.Endpoint`; `report` writes
report.md, report.json and the plots.
"""
