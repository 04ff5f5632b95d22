import json
import shutil

import pytest
import torch

import ditgate
from ditgate.core.errors import ModelNotFoundError, NotAPipelineError, PipelineClassError, RemoteCodeError


@pytest.fixture()
def flux_copy(zoo_path, tmp_path):
    target = tmp_path / "flux"
    shutil.copytree(zoo_path("flux"), target)
    return target


def _set_class(folder, value):
    index_file = folder / "model_index.json"
    index = json.loads(index_file.read_text())
    index["_class_name"] = value
    index_file.write_text(json.dumps(index))


def test_missing_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        ditgate.load(tmp_path / "nowhere")


def test_folder_without_model_index(zoo_path):
    with pytest.raises(NotAPipelineError, match="no model_index.json"):
        ditgate.load(zoo_path("flux") / "transformer")


def test_invalid_model_index(flux_copy):
    (flux_copy / "model_index.json").write_text("{not json")
    with pytest.raises(NotAPipelineError, match="not valid JSON"):
        ditgate.load(flux_copy)


def test_unknown_pipeline_class(flux_copy):
    _set_class(flux_copy, "FluxNotARealPipeline")
    with pytest.raises(PipelineClassError, match="not part of diffusers 0.42.1.*--pipeline"):
        ditgate.load(flux_copy)


def test_unimportable_pipeline_module(flux_copy):
    _set_class(flux_copy, ["no_such_package_xyz", "MyPipeline"])
    with pytest.raises(PipelineClassError, match="cannot import module 'no_such_package_xyz'"):
        ditgate.load(flux_copy)
    with pytest.raises(PipelineClassError, match="cannot import module"):
        ditgate.load(flux_copy, pipeline="no_such_package_xyz:MyPipeline")
    with pytest.raises(PipelineClassError, match="module:Class"):
        ditgate.load(flux_copy, pipeline="diffusers.FluxPipeline")
    with pytest.raises(PipelineClassError, match="has no class"):
        ditgate.load(flux_copy, pipeline="diffusers:NoSuchPipeline")


def test_third_party_pipeline_class_from_importable_module(flux_copy, tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "my_flux_pkg.py").write_text(
        "from diffusers import FluxPipeline\n\nclass MyFluxPipeline(FluxPipeline):\n    pass\n")
    monkeypatch.syspath_prepend(str(package))
    _set_class(flux_copy, ["my_flux_pkg", "MyFluxPipeline"])
    assert type(ditgate.load(flux_copy)).__name__ == "MyFluxPipeline"
    # an explicit --pipeline wins over model_index.json
    assert type(ditgate.load(flux_copy, pipeline="diffusers:FluxPipeline")).__name__ == "FluxPipeline"


def test_remote_code_refused_unless_trusted(flux_copy):
    (flux_copy / "pipeline_tinyflux.py").write_text(
        "from diffusers import FluxPipeline\n\nclass TinyFluxPipeline(FluxPipeline):\n    REMOTE = True\n")
    _set_class(flux_copy, ["pipeline_tinyflux", "TinyFluxPipeline"])
    with pytest.raises(RemoteCodeError, match="--trust-remote-code"):
        ditgate.load(flux_copy)
    pipe = ditgate.load(flux_copy, trust_remote_code=True)
    assert type(pipe).__name__ == "TinyFluxPipeline" and pipe.REMOTE


def test_dtype_and_device(zoo_path):
    pipe = ditgate.load(zoo_path("flux"), dtype="bf16", device="cpu")
    assert pipe.transformer.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        ditgate.load(zoo_path("flux"), dtype="float8")


def test_cli_reports_loader_errors_with_exit_2(run_cli, tmp_path):
    code, _, err = run_cli("zoo", "build", "nope", tmp_path / "x")
    assert code == 2 and "no zoo model named 'nope'" in err
