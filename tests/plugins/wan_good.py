"""A correct integration of the zoo Wan as a plugin: cache-dit's own Wan CP and TP plans."""

from cache_dit.distributed.transformers.wan import WanContextParallelismPlanner, WanTensorParallelismPlanner


def cp_plan(transformer, parallelism_config):
    return WanContextParallelismPlanner()._apply(transformer=transformer, parallelism_config=parallelism_config)


def tp_plan(transformer, tp_mesh, parallelism_config):
    return WanTensorParallelismPlanner().parallelize_transformer(transformer=transformer, tp_mesh=tp_mesh)[1]
