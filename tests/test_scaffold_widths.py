"""`ditgate scaffold` on OmniGen: TP divides the width its attention processor reshapes the heads' output to."""

import builtins
import os

import pytest
from test_scaffold import report_rows

# OmniGenPipeline builds its multimodal processor with torchvision's image transforms, and diffusers leaves the
# processor's name undefined where torchvision does not load (a CPU torch with a torchvision built for CUDA, as on the
# development machine). A text-only call never transforms an image, so where torchvision is missing the processor is
# made with transforms that refuse to run. Every rank is its own process: they get it through a sitecustomize.py.
_STAND_IN = '''
import builtins, types

class _NoImageTransform:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, image):
        raise RuntimeError("torchvision does not load here: OmniGen's input-image transforms cannot run")

def OmniGenMultiModalProcessor(*args, **kwargs):
    import diffusers.pipelines.omnigen.processor_omnigen as module
    module.transforms = types.SimpleNamespace(Compose=_NoImageTransform, Lambda=_NoImageTransform,
                                              ToTensor=_NoImageTransform, Normalize=_NoImageTransform)
    return module.OmniGenMultiModalProcessor(*args, **kwargs)

if not hasattr(builtins, "OmniGenMultiModalProcessor"):
    builtins.OmniGenMultiModalProcessor = OmniGenMultiModalProcessor
'''


@pytest.fixture
def omnigen_builds(tmp_path, monkeypatch):
    """OmniGenPipeline can be built in this process and in every rank's."""
    try:
        import torchvision.transforms  # noqa: F401
        yield
        return
    except Exception:  # a torchvision that does not load raises RuntimeError, not only ImportError
        pass
    folder = tmp_path / "stand_in"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(_STAND_IN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    namespace: dict = {}
    exec(compile(_STAND_IN, "stand_in", "exec"), namespace)
    yield
    if getattr(builtins, "OmniGenMultiModalProcessor", None) is namespace["OmniGenMultiModalProcessor"]:
        del builtins.OmniGenMultiModalProcessor


@pytest.mark.full
def test_tp_divides_the_width_the_processor_reshapes_with(run_cli, tmp_path, omnigen_builds):
    """OmniGen's processor puts the heads' output back together with `reshape(bsz, q_len, attn.out_dim)`. Under TP
    each rank holds half the heads, so `out_dim` is divided with `heads`: tp-2 passes. Left whole (the plan before),
    two ranks' halves are reshaped to the whole width and the row errors ('shape [2, 478, 64] is invalid')."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/omnigen", "--out", out, "--rows", "tp-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    divided = '"out_dim", tp)'
    assert divided in text and report_rows(tmp_path / "run")["tp-2"]["status"] == "passed", text
    plugin = tmp_path / "opposite.py"
    plugin.write_text("\n".join(line for line in text.splitlines() if divided not in line) + "\n")
    code, _, _ = run_cli("run", "zoo:pipe/omnigen", "--rows", "tp-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["tp-2"]
    assert code == 1 and row["status"] == "error" and "invalid" in " ".join(row["reasons"]), row
