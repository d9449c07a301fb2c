"""The dashboard's figures, summed in SQL from the hourly rollups.

spend.py     Scope, Figures: tokens, money, interactions, hit rate and ceiling
latency.py   time to first token, cold and warm, from histogram rollups
replicas.py  per replica load, hit rate and predicted vs reported
tiers.py     per replica cached tokens by cache tier (GPU, host memory, disk)
breaks.py    prefix breakers: break positions ranked, tokens and money lost
reconcile.py per replica and window, the records against the replica's own counters
attribution.py  a tenant's spend by end user and by tag (from the requests, not rollups)
endpoints.py the scope's attempts, tokens and cost per inference endpoint (from the requests)
invoices.py  per UTC day × hosted upstream, what kvgate recorded (against providers' bills)
budgets.py   each budget's period: spend, remaining, burn rate, run-out; refusals over time
serving_cost.py  per vLLM deployment × tenant, GPU cost to serve against charged, cache
             saving; idle hours (from the requests and gpu_costs, not rollups)
"""
