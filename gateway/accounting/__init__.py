"""What every attempt cost, made durable.

records.py   Record: one attempt, and its journal line
ledger.py    the price book in force; Ledger.price (→ Cost) and Ledger.keep
journal.py   the local append-only journal (written before a response's last byte)
recorder.py  journal on the request path, database batches off it
drainer.py   the database writer (a thread or a child process) tailing the journal
store.py     a Record's database row
"""
