"""Lets OmniGenPipeline be built where torchvision does not load (a CPU torch beside a torchvision built for CUDA).

OmniGen's pipeline makes its multimodal processor with torchvision's image transforms, and diffusers leaves the
processor's name undefined where torchvision is missing. A text-only call never transforms an image, so the processor
is made with transforms that refuse to run. Python imports this file at start-up when its folder is on PYTHONPATH, so
every rank's process gets it too: `PYTHONPATH=tests/stand_ins python benchmarks/pipeline_survey.py --only omnigen`.
"""

import builtins
import types


class _NoImageTransform:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, image):
        raise RuntimeError("torchvision does not load here: OmniGen's input-image transforms cannot run")


def OmniGenMultiModalProcessor(*args, **kwargs):  # noqa: N802 (the name diffusers looks up)
    import diffusers.pipelines.omnigen.processor_omnigen as module

    module.transforms = types.SimpleNamespace(Compose=_NoImageTransform, Lambda=_NoImageTransform,
                                              ToTensor=_NoImageTransform, Normalize=_NoImageTransform)
    return module.OmniGenMultiModalProcessor(*args, **kwargs)


def _torchvision_loads() -> bool:
    try:
        import torchvision.transforms  # noqa: F401
    except Exception:  # a torchvision that does not load raises RuntimeError, not only ImportError
        return False
    return True


if not hasattr(builtins, "OmniGenMultiModalProcessor") and not _torchvision_loads():
    builtins.OmniGenMultiModalProcessor = OmniGenMultiModalProcessor
