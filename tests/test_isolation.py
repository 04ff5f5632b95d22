import ditgate
from ditgate.run.exec.isolation import ClassSnapshot


def test_class_patches_are_undone(zoo_path):
    pipe = ditgate.load(zoo_path("wan"))
    processor_cls = type(pipe.transformer.blocks[0].attn1.processor)
    transformer_cls = type(pipe.transformer)
    original_call, original_forward = processor_cls.__call__, transformer_cls.forward
    snapshot = ClassSnapshot.of(pipe)
    # what cache-dit's Wan context-parallel planner does: replace a processor method on the class
    processor_cls.__call__ = lambda self, *a, **k: None
    transformer_cls.forward = lambda self, *a, **k: None
    transformer_cls._added_by_a_patch = True
    restored = snapshot.restore()
    assert processor_cls.__call__ is original_call and transformer_cls.forward is original_forward
    assert not hasattr(transformer_cls, "_added_by_a_patch")
    assert sorted(restored) == sorted([f"{processor_cls.__name__}.__call__", f"{transformer_cls.__name__}.forward",
                                       f"{transformer_cls.__name__}._added_by_a_patch"])
    assert ClassSnapshot.of(pipe).restore() == []  # nothing changed, nothing restored


def test_rows_on_the_pristine_pipeline_match_rows_loaded_from_disk(zoo_path):
    """The launch-once design gives every row a copy of one loaded pipeline: a cached row and a tiled-VAE row on
    copies give the outputs, latents and facts that rows loaded from disk give, bit for bit, and leave the pristine
    pipeline as it was loaded (weights, no hooks, VAE untiled)."""
    import numpy as np
    import torch

    from ditgate.core.model import Model
    from ditgate.run.exec import execute
    from ditgate.run.define import rows

    model = Model.open(zoo_path("flux"), steps=4)
    pristine = execute.load_pristine(model)
    weights = {k: v.clone() for k, v in pristine.pipe.transformer.state_dict().items()}
    call = type(pristine.pipe).__call__
    for row in (rows.Row("cache", "cache", cache=rows.DEFAULT_CACHE), rows.BASELINE_TILED):
        copied = execute.run_row(row, model, pristine=pristine)
        loaded = execute.run_row(row, model)
        assert np.array_equal(copied.output, loaded.output) and np.array_equal(copied.latents, loaded.latents)
        untimed = lambda facts: {k: v for k, v in facts.items() if k != "transformer_time_s"}  # noqa: E731
        assert untimed(copied.facts) == untimed(loaded.facts)
        assert copied.overhead["load_s"] == 0 and copied.overhead["restore_s"] > 0 and loaded.overhead["load_s"] > 0
    after = pristine.pipe.transformer.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    assert type(pristine.pipe).__call__ is call and not pristine.pipe.vae.use_tiling
    for module in pristine.pipe.transformer.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and "_diffusers_hook" not in vars(module)
    copy, _ = pristine.fresh()
    shared = {t.data_ptr() for t in pristine.pipe.transformer.parameters()} & \
        {t.data_ptr() for t in copy.transformer.parameters()}
    assert not shared
