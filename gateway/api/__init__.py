"""The HTTP surfaces, thin: parse at the edge, hand to serving or db, map errors once.

inference.py  /v1/chat/completions, /v1/completions, /v1/models: lean Starlette
              endpoints served straight from the app's __call__ (the hot path)
calls.py      request bodies parsed and validated into a Call
billing.py    /v1/billing: a tenant's own statements
admin.py      /v1/admin: operator endpoints (admin token)
health.py     /healthz, /metrics
deps.py       FastAPI dependency aliases (TenantDep, AdminDep, SessionDep)
openapi.py    the OpenAPI document, inference paths included
"""
