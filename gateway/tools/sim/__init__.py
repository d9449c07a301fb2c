"""``kvgate sim``: a simulated vLLM replica with vLLM's HTTP API, a real prefix cache
(LRU over free blocks, tail first), KV events, Prometheus metrics and a timing model."""
