"""The database, by reader; the only package that imports SQLAlchemy.

models.py      the schema (money Numeric(18, 9), times UTC)
session.py     engines, sessions, and the types and errors others name
migrate.py     alembic upgrade/downgrade (migrations/)
crud.py        tenants, keys and prices: created by operators, read by the gateway
statements.py  billing: a tenant's line items per day × model × price × rate set
figures/       the dashboard's figures, summed from the hourly rollups
lookups.py     names, spans and single requests for the dashboard
writer/        the recorder's side: bulk inserts and the rollups in one transaction
"""
