"""`ditgate scaffold`: an integration plugin written from what `ditgate inspect` observed on the user's call.

`observe` runs the inspection and records the transformer's own inputs (names and shapes of its first call);
`write` turns that into the plugin's source: `block_adapter`, `cp_plan`, `tp_plan`, each decision commented with
the observation behind it, and where two choices are possible the other one named with the row that tells them apart.

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.twin`, `ditgate.inspect`.
"""
