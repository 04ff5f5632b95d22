"""The perf matrix: its rows, the preflight that refuses rows before loading, and a real tier-A run on zoo:flux."""

import json
from pathlib import Path

import jsonschema
import pytest

from ditgate import zoo
from ditgate.perf import matrix as perf
from ditgate.run.define import preflight
from ditgate.core import request
from ditgate.run.define import rows
from ditgate.perf.acceptance import tier_refusal
from ditgate.core.paths import checklists_dir


def _request(path, **overrides):
    return request.build(zoo.read_meta(path), **overrides)


def test_tiers_add_rows_and_cap_presets():
    a, b, c = (perf.matrix_rows(t, max_fn=5) for t in "ABC")
    names = lambda rs: [r.name for r in rs]  # noqa: E731
    assert names(a) == names(b)[:len(a)] and names(b) == names(c)[:len(b)]
    assert max(r.world_size for r in a) == 2 and max(r.world_size for r in b) == 4 and max(r.world_size for r in c) == 8
    assert {r.phase for r in c} >= {"cache", "compile", "quantization", "cp", "tp", "hybrid"}
    by_name = {r.name: r for r in a}
    assert by_name["cache-conservative"].cache["Fn_compute_blocks"] == 5  # 8 capped: the model has 6 blocks
    assert perf.matrix_rows("A")[1].cache["Fn_compute_blocks"] == 8
    assert by_name["cache-fast+taylorseer"].cache == {"Fn_compute_blocks": 1, "Bn_compute_blocks": 0, "mask": "fast",
                                                      "taylorseer": 1}
    assert by_name["compile"].compile_options == {"regional": True}
    with pytest.raises(Exception, match="unknown tier"):
        perf.matrix_rows("D")


def test_compile_and_quantize_fields():
    plain = rows.Row("x", "cache", cache={"Fn_compute_blocks": 1})
    assert rows.Row("x", "cache", cache={"Fn_compute_blocks": 1}, compile=True).fingerprint() != plain.fingerprint()
    assert rows.Row("x", "cache", cache={"Fn_compute_blocks": 1}, quantize={"quant_type": "int8_per_row"}
                    ).fingerprint() != plain.fingerprint()
    with pytest.raises(rows.RowError, match="unknown compile option"):
        rows.from_mapping({"name": "c", "phase": "compile", "compile": {"fast": True}})
    with pytest.raises(rows.RowError, match="quant_type"):
        rows.from_mapping({"name": "q", "phase": "quantization", "quantize": {"backend": "ao"}})


def test_preflight_refuses_before_loading(zoo_path):
    path = zoo_path("flux")
    req = _request(path)
    why = lambda row, **kw: preflight.why_not(row, model_path=path, request=kw.get("req", req),  # noqa: E731
                                              device="cpu")
    tier_c = {r.name: r for r in perf.matrix_rows("C", max_fn=5)}
    assert "CUDA devices only" in why(tier_c["quant-fp8"]) and "CUDA devices only" in why(tier_c["quant-fp8+compile"])
    assert "4 attention heads, which 8 tensor-parallel ranks do not divide" in why(tier_c["tp-8"])
    assert "which 8 Ulysses ranks do not divide" in why(tier_c["cp-ulysses-8"])
    assert "2 per tensor-parallel rank" in why(tier_c["hybrid-u4xtp2"])  # 4 heads / TP-2, over 4 Ulysses ranks
    for fine in ("cp-ulysses-2", "tp-4", "hybrid-u2xtp2", "cache-fast+taylorseer", "compile"):
        assert why(tier_c[fine]) is None, fine
    odd = _request(path, height=132, width=132)  # 33 x 33 packed latent patches
    assert "1089 image tokens" in why(tier_c["cp-ulysses-2"], req=odd)
    assert "no 'fast' schedule for 7 steps" in why(tier_c["cache-fast"], req=_request(path, steps=7))
    graphs = rows.Row("cg", "compile", compile={"mode": "reduce-overhead"})
    assert "CUDA graphs" in why(graphs)
    assert tier_refusal("B", 2) == "tier B needs 4 GPUs and this machine has 2: run --tier A, or on a machine with " \
                                   "4 GPUs"
    assert tier_refusal("A", 1) is None and "needs 8 GPUs" in tier_refusal("C", 4)


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    from ditgate.cli import main

    out = tmp_path_factory.mktemp("matrix") / "run"
    code = main(["matrix", "zoo:flux", "--rows", "cache-fast,cache-fast+taylorseer,compile,quant-fp8,cp-ulysses-2",
                 "--height", "64", "--width", "64", "--warmup", "1", "--repeats", "2", "--out", str(out), "--json"])
    return code, out


@pytest.mark.full  # the fast tier runs the matrix through the perf-matrix notebook
def test_matrix_tier_a_on_flux(matrix_run):
    code, out = matrix_run
    data = json.loads((out / "matrix.json").read_text())
    by_name = {r["name"]: r for r in data["rows"]}
    assert list(by_name) == ["baseline", "cache-fast", "cache-fast+taylorseer", "compile", "quant-fp8", "cp-ulysses-2"]
    assert code == 0 and data["passed"], [(r["name"], r["reasons"]) for r in data["rows"]]
    assert by_name["quant-fp8"]["status"] == "refused" and "CUDA" in by_name["quant-fp8"]["reasons"][0]
    assert by_name["baseline"]["status"] == "reference" and len(by_name["baseline"]["times"]) == 2
    for name in ("cache-fast", "cache-fast+taylorseer", "compile", "cp-ulysses-2"):
        r = by_name[name]
        assert r["status"] == "passed" and r["latency_s"] > 0 and r["speedup"] > 0 and r["psnr"] > 30, r
    assert by_name["compile"]["max_abs"] <= 1e-4  # gated as exact: inductor only reorders float32 arithmetic
    assert by_name["compile"]["predicted"] is None  # same FLOPs: no prediction
    cached = by_name["cache-fast"]["prediction"]
    assert cached["cached_calls"] == 3 and cached["ideal_steps"] == 8 / 5  # cache-dit's 'fast' schedule: 11101001
    assert 1 < cached["transformer"] < cached["ideal_steps"] and cached["predicted"] <= cached["transformer"]
    assert by_name["cp-ulysses-2"]["prediction"]["cp"] == 2
    assert data["flops"]["tokens"] == 256 + 32  # 64x64: 16x16 packed latent patches, 32 text tokens
    assert data["cpu_threads"] == 1


@pytest.mark.full
def test_matrix_files(matrix_run):
    _, out = matrix_run
    report = json.loads((out / "report.json").read_text())
    jsonschema.validate(report, json.loads((checklists_dir() / "report.schema.json").read_text()))
    table = (out / "matrix.md").read_text()
    assert "| cache-fast | cache | 1 |" in table and "## Not run here" in table and "speedup_vs_psnr.png" in table
    assert "**PASS** (every row that ran passed its gate)" in table
    assert "| predicted |" in (out / "report.md").read_text()
    from PIL import Image

    plot = Image.open(out / "speedup_vs_psnr.png")
    assert plot.format == "PNG" and plot.width > 400


def test_matrix_list_rows_and_bad_arguments(run_cli):
    code, out, _ = run_cli("matrix", "zoo:flux", "--tier", "b", "--list-rows")
    assert code == 0 and "hybrid-u2xtp2" in out and "cp-ulysses-8" not in out
    code, _, err = run_cli("matrix", "zoo:flux", "--rows", "warp", "--list-rows")
    assert code == 2 and "unknown row" in err


def test_matrix_on_a_modular_only_pipeline_with_its_plugin(run_cli, tmp_path):
    """`ditgate matrix` takes a plugin, as `ditgate run` does: zoo:flux3 (Flux3ModularPipeline, no standard class)
    with examples/flux3/integration.py runs cache, CP and TP rows; a preset with more front blocks than the tiny
    model's block lists is refused by cache-dit, and the report says the preset, not the adapter, is at fault."""
    plugin = Path(__file__).resolve().parents[1] / "examples" / "flux3" / "integration.py"
    code, out, err = run_cli("matrix", "zoo:flux3", "--integration", plugin, "--rows",
                             "cache-fast,cache-balanced,cp-ulysses-2,tp-2", "--warmup", 0, "--repeats", 1,
                             "--out", tmp_path / "m", "--json")
    assert code == 1, err[-2000:]
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert {n: rows[n]["status"] for n in ("cache-fast", "cp-ulysses-2", "tp-2")} == dict.fromkeys(
        ("cache-fast", "cp-ulysses-2", "tp-2"), "passed")
    assert rows["cache-balanced"]["status"] == "error"
    assert "not an adapter fault" in rows["cache-balanced"]["reasons"][0]
    assert "check the BlockAdapter" not in rows["cache-balanced"]["reasons"][0]
