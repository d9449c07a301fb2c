"""The dated price book: ``catalog/*.yaml`` (data), ``book.py`` (load, validate, look up by
model and moment), ``cost.py`` (Decimal cost per token class), ``tokens.py`` (the four token
classes). Imports nothing of kvgate's."""
