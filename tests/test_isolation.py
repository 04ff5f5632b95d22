import ditgate
from ditgate.run.isolation import ClassSnapshot


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
