"""Transports to upstreams, and nothing about billing or routing.

vllm.py       the pooled aiohttp session; a JSON POST and a streamed POST
sse.py        server-sent events split into whole events, usage captured
providers.py  hosted providers through litellm, imported lazily (the only module that
              imports it)
"""
