"""Provider bills read and set against kvgate's records (``kvgate reconcile invoice``).

Pure: no database, no network. ``reading`` turns a provider's usage and cost export into a
``Bill`` (tokens per class and USD per UTC day × the provider's model id); ``compare`` sets
a bill against what kvgate recorded of the requests it sent to that provider's hosted API.

    shapes.py    the values (Tokens, Billed, Bill) and InvoiceError, with the checked
                 reads of JSON members every format uses
    openai.py    OpenAI's organization Usage API (completions) and Costs API pages
    anthropic.py Anthropic's Admin API usage report (messages) and cost report
    reading.py   a file → a Bill, for either provider
    compare.py   which records a provider billed, model ids matched, the variance
"""
