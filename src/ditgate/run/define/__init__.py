"""What a run runs: the rows (`rows`), the cache-dit configuration objects a row asks for (`configs`), the
preflight that refuses a row this machine cannot run before anything loads (`preflight`), and the speedup each row
should reach from the FLOP count (`predict`).

May import: `ditgate.core`, `ditgate.inspect` (FLOP counts), cache-dit's configuration classes. Nothing else of
`ditgate.run`.
"""
