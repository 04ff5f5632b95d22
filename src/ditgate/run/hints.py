"""What to look at first when a row of a phase fails (shown next to its error in the report)."""

HINTS = {
    "cache": "check the BlockAdapter: the block lists, each list's ForwardPattern (the order of the block's "
             "outputs: `ditgate inspect MODEL` observes it) and has_separate_cfg (transformer calls per step)",
    "cp": "check the CP plan: every sequence tensor split at the entry needs a gather (_ContextParallelOutput) before "
          "the output projection; attention masks are reordered, never split; all ranks must see the same RoPE grid",
    "tp": "check the TP plan: when Q/K/V are sharded the head count must be divided (shard_div_attr), every "
          "ColwiseParallel needs its RowwiseParallel partner, and tensors concatenated with DTensors must be DTensors",
    "tep": "check that cache-dit has a text-encoder TP planner for this encoder class (`ditgate inspect MODEL`)",
    "vaep": "check that cache-dit has a VAE planner for this exact VAE class and that the VAE supports tiling",
    "hybrid": "make CP and TP pass on their own first; hybrid needs at least 4 ranks",
    "compile": "look for graph breaks and recompiles (TORCH_LOGS=graph_breaks,recompiles); a row with compile "
               "options {regional: false} or {backend: aot_eager} tells the model's code from inductor's",
    "quantization": "check which layers cache-dit quantized (QuantizeConfig verbose=True) and exclude sensitive "
                    "ones (exclude_layers)",
}
