"""`ditgate scaffold` on OmniGen: TP divides the width its attention processor reshapes the heads' output to."""

import pytest
from test_scaffold import report_rows


def _omnigen_missing() -> str:
    """Why OmniGen's pipeline cannot be built here ('' where it can): its processor needs torchvision's transforms,
    and a torchvision built for another torch fails to load its operators."""
    try:
        import torchvision.transforms  # noqa: F401
    except Exception as exc:  # a broken build raises RuntimeError, not ImportError
        return f"OmniGenPipeline needs torchvision, which does not load here: {type(exc).__name__}: {exc}"
    return ""


@pytest.mark.full
@pytest.mark.skipif(bool(_omnigen_missing()), reason=_omnigen_missing() or "-")
def test_tp_divides_the_width_the_processor_reshapes_with(run_cli, tmp_path):
    """OmniGen's processor puts the heads' output back together with `reshape(bsz, q_len, attn.out_dim)`. Under TP
    each rank holds half the heads, so `out_dim` is divided with `heads`: tp-2 passes. Left whole (the plan before),
    two ranks' halves are reshaped to the whole width and the row fails ('shape [2, 478, 64] is invalid')."""
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
    assert code == 1 and row["status"] == "failed", row
