"""`ditgate scaffold`: an integration plugin written from what `ditgate inspect` observed on the user's call.

`write.observe` runs the inspection and records the transformer's own inputs (names and shapes of its first call),
its children's inputs and its attention processors; `write.plugin_source` turns that into the plugin's source:
`block_adapter`, `cp_plan` (`cp`), `tp_plan` (`tp`: which Linears each block structure shards), each decision commented with the observation behind it, and where two
choices are possible the other one named with the row that tells them apart. `runtime` holds the code a plugin
carries when a plan dict is not enough (attention routed through cache-dit's dispatcher, routing on the gathered
sequence); `loop` the block-loop PatchFunctor (`BlockLoop`) and its arguments, from what the loop was seen doing;
`grid` the CP choice for blocks that fold their stream into the image grid (run on the gathered stream).

May import: `ditgate.core`, `ditgate.zoo`, `ditgate.twin`, `ditgate.inspect`.
"""
