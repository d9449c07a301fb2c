"""The request path, for every backend kind.

context.py   Context (a request), Attempt (one try), Outcome, Expectation
path.py      Serving.serve: plan → failover (send | open) → learn → record → respond
backend.py   what a backend kind provides to the path (the Backend protocol)
records.py   the one mapping from (context, attempt, outcome) to a priced Record
replies.py   the one usage shape clients get, and how streams end
streaming.py EventStream: SSE out, stopped when the client leaves
vllm.py      vLLM pools: routed by the fleet, called over aiohttp
hosted.py    hosted providers translated through litellm
"""
