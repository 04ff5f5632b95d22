"""Every error a user can cause exits 2 with one line on stderr: no traceback, never 1 (1 means a gate failed), and
nothing made on the way (a refused `run` leaves no run folder).

One table for every command. A case is (command line, words the message must hold); `{t}` in an argument is the
test's temporary folder, `{f}` the fixture files made there (see `files`). Cases run in-process and fail before
loading any model, so the whole table takes seconds.
"""

import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

UNWRITABLE = "/sys/ditgate-unwritable"  # refused even to root (sysfs)
PRECIOUS = "a file outside every folder a command writes: links point at it"


class _Boom:
    """A pickle that writes a marker file when it is loaded: loading it would run code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def files(tmp_path_factory, zoo_path):
    """Every case's input files, made once for the module (each case only reads them; a case that made something
    fails, and what it made is removed before the next case)."""
    t = tmp_path_factory.mktemp("bad-inputs")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(t / "ok.png")
    np.save(t / "ok.npy", np.zeros((4, 8), np.float32))
    rng = np.random.default_rng(0)
    for name, array in {"empty": np.zeros((0,), np.float32), "scalar": np.float32(3), "text": np.array(["a", "bc"]),
                        "chw": rng.random((3, 32, 32), np.float32), "int-image": np.zeros((32, 32, 3), np.int32),
                        "wide-image": rng.random((32, 32, 3), np.float32) * 255, "wave": rng.random((1, 4000)),
                        "tiny-square": rng.random((3, 3, 3), np.float32)}.items():
        np.save(t / f"{name}.npy", array)
    (t / "garbage.npy").write_bytes(b"\x93NUMPY garbage that is not a header")
    (t / "garbage.pt").write_bytes(b"not a zip, not a pickle")
    with open(t / "evil.pt", "wb") as out:  # a plain pickle that would create t/PWNED when unpickled
        pickle.dump(_Boom(str(t / "PWNED")), out)
    with zipfile.ZipFile(t / "evil-zip.pt", "w") as z:  # torch.save's zip layout around the same pickle
        z.writestr("archive/data.pkl", pickle.dumps(_Boom(str(t / "PWNED"))))
        z.writestr("archive/version", "3\n")
    np.save(t / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (t / "a-file").write_text("a plain file")
    (t / "list-index").mkdir()
    (t / "list-index" / "model_index.json").write_text("[1, 2, 3]")
    (t / "string-index").mkdir()
    (t / "string-index" / "model_index.json").write_text('"FluxPipeline"')
    rows = t / "rows"
    rows.mkdir()
    for name, text in {
        "bool-size": "- {name: x, phase: tp, parallel: {tp_size: true}}",
        "no-is-true": "- {name: x, phase: vaep, baseline: baseline-tiled, parallel: {tp_size: 2, vae: 'no'}}",
        "tiling-no": "- {name: x, vae_tiling: 'no'}",
        "int-name": "- {name: 7}",
        "dup-name": "- {name: x, phase: cache, cache: {Fn_compute_blocks: 1}}\n"
                    "- {name: x, phase: cache, cache: {Fn_compute_blocks: 2}}",
        "cache-list": "- {name: x, phase: cache, cache: [1, 2]}",
        "parallel-str": "- {name: x, phase: cp, parallel: ulysses}",
        "baseline-int": "- {name: x, phase: cache, cache: {}, baseline: 5}",
        "desc-list": "- {name: x, description: [a]}",
        "huge-size": "- {name: x, phase: cp, parallel: {ulysses_size: 100000000000000000000}}",
        "phase-list": "- {name: x, phase: [cp]}",
        "cache-no-phase": "- {name: x, cache: {Fn_compute_blocks: 1}}",
        "parallel-no-phase": "- {name: x, parallel: {ulysses_size: 2}}",
        "compile-no-phase": "- {name: x, compile: true}",
        "reference-nobody-compares": "- {name: x, baseline: null, quantize: {quant_type: float8_per_row}}",
    }.items():
        (rows / f"{name}.yaml").write_text(text + "\n")
    # transformer configs that lie: rotary axes that do not sum to the head size, a billion layers, negative heads
    lie = t / "lie"
    lie.mkdir()
    flux = json.loads((zoo_path("zoo:flux") / "transformer" / "config.json").read_text())
    for name, change in {"rope": {"axes_dims_rope": [2, 2, 2]}, "huge": {"num_layers": 10**9},
                         "negative": {"num_attention_heads": -4}}.items():
        (lie / f"{name}.json").write_text(json.dumps({**flux, **change}))
    (t / "empty").mkdir()
    (t / "list.json").write_text("[1, 2]")
    (t / "bad.json").write_text("{not json")
    (t / "call-output-type.json").write_text('{"output_type": "latent"}')
    (t / "plugin.py").write_text((Path(__file__).parent / "plugins" / "flux_good.py").read_text())
    # a run folder with a corrupt run.json, and one whose finished row has a corrupt result.json
    (t / "corrupt-run").mkdir()
    (t / "corrupt-run" / "run.json").write_text("{not json")
    # cache-dit trees for export: the files it edits, one registering "Flux"; one with a file linked out of the
    # tree, one whose package is a link to another tree
    tree = t / "tree" / "cache_dit"
    for rel, text in {"__init__.py": "", "caching/block_adapters/__init__.py": "", "_utils/examples.py": "",
                      "caching/block_adapters/adapters.py": '@BlockAdapterRegister.register("Flux")\ndef f(p):\n'
                                                            "    pass\n",
                      "distributed/transformers/planners.py": "def _activate_cp_planners():\n    pass\n\n\n"
                                                              "def _activate_tp_planners():\n    pass\n"}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    shutil.copytree(t / "tree", t / "tree-linked-file")
    (t / "tree-linked-file" / "cache_dit" / "_utils" / "examples.py").unlink()
    (t / "tree-linked-file" / "cache_dit" / "_utils" / "examples.py").symlink_to(t / "precious.txt")
    (t / "tree-linked-package").mkdir()
    (t / "tree-linked-package" / "cache_dit").symlink_to(tree, target_is_directory=True)
    (t / "flux_as_new.py").write_text((Path(__file__).parents[1] / "examples" / "plugins" / "flux_as_new.py")
                                      .read_text())
    # run folders with links out of them: --resume would write (or truncate) what they point at
    (t / "precious.txt").write_text(PRECIOUS)
    (t / "outside").mkdir()
    for name in ("linked-row", "linked-result", "linked-lock"):
        (t / name / "rows" / "cache").mkdir(parents=True)
        (t / name / "run.json").write_text("{}")
    shutil.rmtree(t / "linked-row" / "rows" / "cache")
    (t / "linked-row" / "rows" / "cache").symlink_to(t / "outside", target_is_directory=True)
    (t / "linked-result" / "rows" / "cache" / "result.json").symlink_to(t / "precious.txt")
    (t / "linked-lock" / ".lock").symlink_to(t / "precious.txt")
    # a skill source with a broken link in references/
    skill = t / "skill-src"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: broken-link-skill\ndescription: a skill with a dangling link\n---\n"
                                    "# Broken\n")
    (skill / "references" / "gone.md").symlink_to(t / "does-not-exist.md")
    # skill sources with links out of the skill: a file, a folder, SKILL.md itself
    for name, (rel, target) in {"skill-linked-file": ("references/x.md", t / "precious.txt"),
                                "skill-linked-folder": ("examples", t / "outside"),
                                "skill-linked-md": ("SKILL.md", t / "outside-skill.md")}.items():
        (t / name / "references").mkdir(parents=True)
        if rel != "SKILL.md":
            (t / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: a skill with a link out\n---\n# X\n")
        (t / name / rel).symlink_to(target, target_is_directory=Path(target).is_dir())
    (t / "outside-skill.md").write_text("---\nname: skill-linked-md\ndescription: outside\n---\n# X\n")
    # model folders that lie: a call that is not a mapping, a pipeline class from the standard library (importing
    # `this` prints the Zen of Python), a relative module name
    for name, change in {"call-list": ("ditgate.json", {"call": [1]}),
                         "json-output-type": ("ditgate.json", {"call": {"output_type": "pt"}}),
                         "vocab-lies": ("text_encoder/config.json", {"vocab_size": 8}),
                         "layers-lie": ("transformer/config.json", {"num_layers": 10**9}),
                         "heads-lie": ("transformer/config.json", {"num_attention_heads": -4}),
                         "linked-config": ("ditgate.json", {}),
                         "class-stdlib": ("model_index.json", {"_class_name": ["this", "X"]}),
                         "class-relative": ("model_index.json", {"_class_name": ["..evil", "X"]}),
                         "component-stdlib": ("model_index.json", {"transformer": ["os", "path"]})}.items():
        folder = t / name
        shutil.copytree(zoo_path("flux"), folder, ignore=lambda d, names: [n for n in names if n.endswith(".safetensors")])
        file, values = change
        data = json.loads((folder / file).read_text()) if (folder / file).is_file() else {}
        (folder / file).write_text(json.dumps(data | values))
    # a config that does not match the weights beside it (its vocabulary cut to 8)
    shutil.copytree(zoo_path("flux"), t / "weights-lie")
    config = json.loads((t / "weights-lie" / "text_encoder" / "config.json").read_text())
    (t / "weights-lie" / "text_encoder" / "config.json").write_text(json.dumps(config | {"vocab_size": 8}))
    (t / "linked-config" / "scheduler" / "scheduler_config.json").unlink()
    (t / "linked-config" / "scheduler" / "scheduler_config.json").symlink_to(t / "precious.txt")
    return t


def _fmt(args, t):
    return [str(a).format(t=t) for a in args]


CASES = {
    # gate: unreadable and malicious inputs
    "gate-garbage-npy": (["gate", "--phase", "cp", "{t}/garbage.npy", "{t}/ok.npy"], ["garbage.npy"]),
    "gate-garbage-pt": (["gate", "--phase", "cp", "{t}/garbage.pt", "{t}/ok.npy", "--modality", "latent"],
                        ["garbage.pt"]),
    "gate-pickle-pt": (["gate", "--phase", "cp", "{t}/evil.pt", "{t}/ok.npy", "--modality", "latent"],
                       ["evil.pt"]),
    "gate-pickle-zip-pt": (["gate", "--phase", "cp", "{t}/evil-zip.pt", "{t}/ok.npy", "--modality", "latent"],
                           ["evil-zip.pt"]),
    "gate-object-npy": (["gate", "--phase", "cp", "{t}/objects.npy", "{t}/ok.npy"], ["objects.npy"]),
    "gate-bad-dtype": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--dtype", "float99"], ["float99"]),
    "gate-unknown-phase": (["gate", "--phase", "warp", "{t}/ok.png", "{t}/ok.png"], ["warp"]),
    "gate-gates-file-missing": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--gates", "{t}/nope.json"],
                                ["nope.json"]),
    "gate-corrupt-gates": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--gates", "{t}/a-file"],
                           ["a-file"]),
    # run: options refused before any folder is made
    "run-bad-dtype": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--dtype", "float99"],
                      ["float99"]),
    "run-bad-device": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--device", "tpu"], ["tpu"]),
    "run-negative-warmup": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--warmup", "-1"],
                            ["--warmup"]),
    "run-zero-repeats": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--repeats", "0"],
                         ["--repeats"]),
    "run-zero-timeout": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--timeout", "0"],
                         ["--timeout"]),
    "run-nan-timeout": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--timeout", "nan"],
                        ["--timeout"]),
    "run-missing-integration": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                 "--integration", "{t}/no-such-plugin.py"], ["no-such-plugin.py"]),
    "run-out-is-a-file": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/a-file"], ["a-file"]),
    "run-out-unwritable": (["run", "zoo:flux", "--rows", "cache", "--out", UNWRITABLE], [UNWRITABLE]),
    "run-corrupt-run-json": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/corrupt-run", "--resume"],
                             ["run.json"]),
    "run-zero-height": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--height", "0"], ["height"]),
    "run-overflowing-height": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                "--height", "1" + "0" * 30], ["--height"]),
    "run-zero-steps": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--steps", "0"], ["steps"]),
    "run-index-is-a-list": (["run", "{t}/list-index", "--rows", "cache", "--out", "{t}/out"],
                            ["model_index.json"]),
    "run-rows-file-missing": (["run", "zoo:flux", "--rows-file", "{t}/rows/none.yaml", "--out", "{t}/out"],
                              ["none.yaml"]),
    # typed rows files: the file, the row and the field are named
    "rows-bool-rank-count": (["run", "zoo:flux", "--rows-file", "{t}/rows/bool-size.yaml", "--out", "{t}/out"],
                             ["bool-size.yaml", "row 1", "tp_size"]),
    "rows-no-is-not-true": (["run", "zoo:flux", "--rows-file", "{t}/rows/no-is-true.yaml", "--out", "{t}/out"],
                            ["no-is-true.yaml", "row 1", "vae"]),
    "rows-tiling-no": (["run", "zoo:flux", "--rows-file", "{t}/rows/tiling-no.yaml", "--out", "{t}/out"],
                       ["tiling-no.yaml", "row 1", "vae_tiling"]),
    "rows-int-name": (["run", "zoo:flux", "--rows-file", "{t}/rows/int-name.yaml", "--out", "{t}/out"],
                      ["int-name.yaml", "row 1", "name"]),
    "rows-duplicate-name": (["run", "zoo:flux", "--rows-file", "{t}/rows/dup-name.yaml", "--out", "{t}/out"],
                            ["dup-name.yaml", "row 2", "name"]),
    "rows-cache-list": (["run", "zoo:flux", "--rows-file", "{t}/rows/cache-list.yaml", "--out", "{t}/out"],
                        ["cache-list.yaml", "row 1", "cache"]),
    "rows-parallel-str": (["run", "zoo:flux", "--rows-file", "{t}/rows/parallel-str.yaml", "--out", "{t}/out"],
                          ["parallel-str.yaml", "row 1", "parallel"]),
    "rows-baseline-int": (["run", "zoo:flux", "--rows-file", "{t}/rows/baseline-int.yaml", "--out", "{t}/out"],
                          ["baseline-int.yaml", "row 1", "baseline"]),
    "rows-description-list": (["run", "zoo:flux", "--rows-file", "{t}/rows/desc-list.yaml", "--out", "{t}/out"],
                              ["desc-list.yaml", "row 1", "description"]),
    "rows-huge-size": (["run", "zoo:flux", "--rows-file", "{t}/rows/huge-size.yaml", "--out", "{t}/out"],
                       ["huge-size.yaml", "row 1", "ulysses_size"]),
    "rows-phase-list": (["run", "zoo:flux", "--rows-file", "{t}/rows/phase-list.yaml", "--out", "{t}/out"],
                        ["phase-list.yaml", "row 1", "phase"]),
    # inspect
    "inspect-index-is-a-list": (["inspect", "{t}/list-index"], ["model_index.json"]),
    "inspect-index-is-a-string": (["inspect", "{t}/string-index"], ["model_index.json"]),
    "inspect-plan-unwritable": (["inspect", "zoo:flux", "--plan", UNWRITABLE + "/plan.md"], ["plan.md"]),
    "inspect-plan-under-a-file": (["inspect", "zoo:flux", "--plan", "{t}/a-file/plan.md"], ["plan.md"]),
    "inspect-bad-dtype": (["inspect", "zoo:flux", "--dtype", "float99"], ["float99"]),
    "inspect-bad-device": (["inspect", "zoo:flux", "--device", "tpu"], ["tpu"]),
    # checklist / matrix / flops / zoo / notebook
    "checklist-bad-dtype": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out", "--dtype", "float99"],
                            ["float99"]),
    "checklist-missing-integration": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out",
                                       "--integration", "{t}/no-such-plugin.py"], ["no-such-plugin.py"]),
    "matrix-zero-threads": (["matrix", "zoo:flux", "--out", "{t}/out", "--threads", "0"], ["--threads"]),
    "matrix-bad-dtype": (["matrix", "zoo:flux", "--out", "{t}/out", "--dtype", "float99"], ["float99"]),
    "flops-negative-height": (["flops", "zoo:flux", "--height", "-16"], ["height"]),
    "flops-overflowing-height": (["flops", "zoo:flux", "--height", "1" + "0" * 30], ["height"]),
    "flops-index-is-a-list": (["flops", "{t}/list-index", "--height", "64", "--width", "64"], ["list-index"]),
    "flops-frames-on-an-image-model": (["flops", "zoo:flux", "--height", "64", "--width", "64", "--frames", "5"],
                                       ["--frames", "images"]),
    "flops-beyond-the-rotary-table": (["flops", "zoo:wan", "--height", "480", "--width", "832", "--frames", "81",
                                       "--json"], ["rope_max_seq_len 32"]),
    "flops-config-rope-lies": (["flops", "{t}/lie/rope.json", "--height", "64", "--width", "64"],
                               ["cannot run at 64x64"]),
    "flops-config-billion-layers": (["flops", "{t}/lie/huge.json", "--height", "64", "--width", "64"],
                                    ["num_layers is 1,000,000,000"]),
    "flops-config-negative-heads": (["flops", "{t}/lie/negative.json", "--height", "64", "--width", "64"],
                                    ["does not build"]),
    "zoo-build-onto-a-file": (["zoo", "build", "flux", "{t}/a-file"], ["a-file"]),
    "zoo-build-overwrite-a-file": (["zoo", "build", "flux", "{t}/a-file", "--overwrite"], ["a-file"]),
    "zoo-build-unwritable": (["zoo", "build", "flux", UNWRITABLE], [UNWRITABLE]),
    # skill install
    "skill-target-is-a-file": (["skill", "install", "--target", "{t}/a-file"], ["a-file"]),
    "skill-target-unwritable": (["skill", "install", "--target", UNWRITABLE], [UNWRITABLE]),
    "skill-broken-link": (["skill", "install", "--target", "{t}/project", "--source", "{t}/skill-src"],
                          ["gone.md"]),
    # the probe's weak spots: each used to end in a traceback (exit 1), run rows first, or print what it imported
    "run-call-not-a-mapping": (["run", "{t}/call-list", "--rows", "cache", "--out", "{t}/out"], ["\"call\""]),
    "inspect-class-from-stdlib": (["inspect", "{t}/class-stdlib", "--json"], ["standard library"]),
    "inspect-class-relative": (["inspect", "{t}/class-relative", "--json"], ["absolute module name"]),
    "twin-component-from-stdlib": (["twin", "{t}/component-stdlib", "{t}/out"], ["standard library"]),
    "run-pipeline-from-stdlib": (["run", "zoo:flux", "--pipeline", "os:path", "--rows", "cache", "--out", "{t}/out"],
                                 ["standard library"]),
    "run-pipeline-not-a-class": (["run", "zoo:flux", "--pipeline", "ditgate.cli:main", "--rows", "cache",
                                  "--out", "{t}/out"], ["no class"]),
    "run-cache-config-not-a-number": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                       "--cache-config", "max_warmup_steps=abc"], ["max_warmup_steps", "integer"]),
    "run-cache-config-below-cache-dit": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                          "--cache-config", "Fn_compute_blocks=-1"], ["Fn_compute_blocks", "at least 1"]),
    "run-cache-config-flag-not-bool": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                        "--cache-config", "cfg_compute_first=1"], ["true or false"]),
    "run-size-below-ssim-window": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--height", "7",
                                    "--width", "7"], ["SSIM window"]),
    "diff-empty-row": (["diff", "zoo:flux", "--row", "", "--out", "{t}/out"], ["name one row"]),
    "diff-two-rows": (["diff", "zoo:flux", "--row", "cache,tp-2", "--out", "{t}/out"], ["name one row"]),
    # typos: the nearest command or option is named
    "cli-command-typo": (["rn", "zoo:flux"], ["did you mean run?"]),
    "cli-action-typo": (["zoo", "buil", "flux"], ["did you mean build?"]),
    "cli-option-typo": (["run", "zoo:flux", "--rowz", "cache", "--out", "{t}/out"], ["did you mean --rows?"]),
    "cli-option-typo-with-value": (["flops", "zoo:flux", "--height", "64", "--width", "64", "--stesp=3"],
                                   ["did you mean --steps?"]),
    "cli-nested-option-typo": (["zoo", "build", "flux", "{t}/out", "--sed", "3"], ["did you mean --seed?"]),
    "cli-extra-positional": (["inspect", "zoo:flux", "zoo:wan"], ["unrecognized arguments: zoo:wan"]),
    # more of each command's own arguments
    "gate-missing-base": (["gate", "--phase", "cp", "{t}/nope.png", "{t}/ok.png"], ["nope.png"]),
    "gate-missing-candidate": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/nope.png"], ["nope.png"]),
    "gate-text-as-image": (["gate", "--phase", "cp", "{t}/a-file", "{t}/ok.png"], ["unknown kind of file"]),
    "gate-floor-without-value": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--floor", "psnr"],
                                 ["METRIC=VALUE"]),
    "gate-floor-a-word": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--floor", "psnr=abc"],
                          ["METRIC=VALUE"]),
    "gate-floor-unknown-metric": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--floor", "zzz=3"],
                                  ["zzz"]),
    "gate-noise-missing": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--noise", "{t}/nope.npy"],
                           ["nope.npy"]),
    "gate-latents-missing": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--latents", "{t}/nope.npy",
                              "{t}/nope2.npy"], ["nope.npy"]),
    "gate-audio-rate-zero": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--sample-rate", "0",
                              "--modality", "audio"], ["sample rate"]),
    "gate-gates-not-json": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--gates", "{t}/bad.json"],
                            ["bad.json"]),
    "zoo-build-unknown": (["zoo", "build", "nosuch", "{t}/out"], ["nosuch"]),
    "zoo-build-into-a-full-folder": (["zoo", "build", "flux", "{t}/list-index"], ["not empty"]),
    "skill-source-missing": (["skill", "install", "--target", "{t}/out", "--source", "{t}/nope"], ["nope"]),
    "skill-source-a-file": (["skill", "install", "--target", "{t}/out", "--source", "{t}/a-file"], ["a-file"]),
    "skill-source-not-a-skill": (["skill", "install", "--target", "{t}/out", "--source", "{t}/empty"],
                                 ["holds no SKILL.md"]),
    "lint-missing-root": (["lint", "{t}/nope"], ["does not exist"]),
    "lint-root-a-file": (["lint", "{t}/a-file"], ["a-file"]),
    "lint-unknown-rule": (["lint", "--disable", "nosuchrule"], ["nosuchrule"]),
    "lint-unknown-warn-rule": (["lint", "--warn", "nosuchrule"], ["nosuchrule"]),
    "checklist-unknown-phase": (["checklist", "warp", "--model", "zoo:flux", "--out", "{t}/out"], ["warp"]),
    "diff-empty-row": (["diff", "zoo:flux", "--row", "", "--out", "{t}/out"], ["--row"]),
    "diff-unknown-row": (["diff", "zoo:flux", "--row", "nosuch", "--out", "{t}/out"], ["nosuch"]),
    "diff-zero-timeout": (["diff", "zoo:flux", "--row", "cache", "--out", "{t}/out", "--timeout", "0"], ["--timeout"]),
    "diff-nan-timeout": (["diff", "zoo:flux", "--row", "cache", "--out", "{t}/out", "--timeout", "nan"],
                         ["--timeout"]),
    "diff-reference-row": (["diff", "zoo:flux", "--row", "baseline", "--out", "{t}/out"], ["reference row"]),
    "matrix-unknown-row": (["matrix", "zoo:flux", "--rows", "nosuch", "--out", "{t}/out"], ["nosuch"]),
    "run-unknown-row": (["run", "zoo:flux", "--rows", "nosuch", "--out", "{t}/out"], ["nosuch"]),
    "run-zero-seeds": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--seeds", "0"], ["--seeds"]),
    "run-prompts-missing": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--prompts", "{t}/nope.txt"],
                            ["nope.txt"]),
    "run-cache-config-unknown-field": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                        "--cache-config", "nosuch=1"], ["nosuch"]),
    "run-cache-config-without-value": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out",
                                        "--cache-config", "Fn_compute_blocks"], ["KEY=VALUE"]),
    "run-cache-dit-missing": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--cache-dit", "{t}/nope"],
                              ["no cache_dit package"]),
    "run-cp-split-dims-garbage": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--cp-split-dims",
                                   "garbage"], ["LIST=DIM"]),
    "export-integration-missing": (["export", "--model", "zoo:flux", "--integration", "{t}/nope.py", "--to",
                                    "{t}/out"], ["nope.py"]),
    "export-to-missing": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to", "{t}/nope"],
                          ["no cache_dit package"]),
    "export-to-a-file": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to", "{t}/a-file"],
                         ["no cache_dit package"]),
    "export-to-not-cache-dit": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                 "{t}/empty"], ["no cache_dit package"]),
    "twin-out-a-file": (["twin", "zoo:flux", "{t}/a-file"], ["is a file"]),
    "twin-out-a-full-folder": (["twin", "zoo:flux", "{t}/list-index"], ["not empty"]),
    "twin-out-unwritable": (["twin", "zoo:flux", UNWRITABLE], ["/sys"]),
    # lint: a folder that is not a skill is one line
    "lint-not-a-skill": (["lint", "{t}/list-index"], ["holds no SKILL.md", "not a skill"]),
    # call arguments ditgate sets itself, or outputs it would not gate, refused instead of replaced in silence
    "run-call-output-type": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--call", "output_type=pil"],
                             ["output_type", "ditgate passes it itself"]),
    "run-call-step-callback": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--call",
                                "callback_on_step_end=null"], ["callback_on_step_end", "passes it itself"]),
    "run-call-generator": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--call", "generator=3"],
                           ["generator", "passes it itself"]),
    "run-call-two-images-per-prompt": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--call",
                                        "num_images_per_prompt=2"], ["num_images_per_prompt=2", "one output"]),
    "run-call-file-output-type": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--call-file",
                                   "{t}/call-output-type.json"], ["output_type", "--call-file"]),
    "run-ditgate-json-output-type": (["run", "{t}/json-output-type", "--rows", "cache", "--out", "{t}/out"],
                                     ["ditgate.json", "output_type"]),
    "inspect-ditgate-json-output-type": (["inspect", "{t}/json-output-type"], ["ditgate.json", "output_type"]),
    # a row that configures a feature but names no phase would run and never be gated
    "rows-cache-without-phase": (["run", "zoo:flux", "--rows-file", "{t}/rows/cache-no-phase.yaml", "--out",
                                  "{t}/out"], ["cache-no-phase.yaml", "names no phase", "phase: cache"]),
    "rows-parallel-without-phase": (["run", "zoo:flux", "--rows-file", "{t}/rows/parallel-no-phase.yaml", "--out",
                                     "{t}/out"], ["names no phase", "phase: cp"]),
    "rows-compile-without-phase": (["run", "zoo:flux", "--rows-file", "{t}/rows/compile-no-phase.yaml", "--out",
                                    "{t}/out"], ["names no phase", "phase: compile"]),
    "rows-reference-nobody-compares": (["run", "zoo:flux", "--rows-file", "{t}/rows/reference-nobody-compares.yaml",
                                        "--out", "{t}/out"], ["no row compares with it", "phase: quantization"]),
    "matrix-rows-without-phase": (["matrix", "zoo:flux", "--rows-file", "{t}/rows/cache-no-phase.yaml", "--out",
                                   "{t}/out"], ["names no phase"]),
    # scaffold: a plugin file it cannot write, refused before the model is inspected
    "scaffold-out-a-folder": (["scaffold", "zoo:flux", "--out", "{t}/empty"], ["empty"]),
    "scaffold-out-under-a-file": (["scaffold", "zoo:flux", "--out", "{t}/a-file/plugin.py"], ["plugin.py"]),
    "scaffold-out-unwritable": (["scaffold", "zoo:flux", "--out", UNWRITABLE + "/plugin.py"], ["plugin.py"]),
    "scaffold-unknown-row": (["scaffold", "zoo:flux", "--out", "{t}/out", "--rows", "nosuch"], ["nosuch"]),
    "scaffold-no-row": (["scaffold", "zoo:flux", "--out", "{t}/out", "--rows", ","], ["names no row"]),
    # an output folder that is a file, for every command that makes one: refused before any work
    "diff-out-a-file": (["diff", "zoo:flux", "--row", "cp-ulysses-2", "--out", "{t}/a-file"], ["a-file"]),
    "checklist-out-a-file": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/a-file"], ["a-file"]),
    "matrix-out-a-file": (["matrix", "zoo:flux", "--out", "{t}/a-file"], ["a-file"]),
    "scaffold-run-dir-a-file": (["scaffold", "zoo:flux", "--out", "{t}/out", "--run-dir", "{t}/a-file"], ["a-file"]),
    "export-out-a-file": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to", "{t}/tree",
                           "--out", "{t}/a-file"], ["a-file"]),
    "scaffold-run-dir-under-a-file": (["scaffold", "zoo:flux", "--out", "{t}/out", "--run-dir", "{t}/a-file/run"],
                                      ["a-file is a file"]),
    "export-out-under-a-file": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                 "{t}/tree", "--out", "{t}/a-file/export"], ["a-file is a file"]),
    # serve: an idle time that is no time (inf overflowed the socket's timeout after the imports: a traceback)
    "serve-idle-infinite": (["serve", "--idle", "inf"], ["--idle"]),
    "serve-idle-nan": (["serve", "--idle", "nan"], ["--idle"]),
    "serve-idle-negative": (["serve", "--idle", "-5"], ["--idle"]),
    "serve-idle-a-word": (["serve", "--idle", "long"], ["invalid float value"]),
    # export: code in a model id, a tree that already registers the name, links out of the tree
    "export-model-id-with-code": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                   "{t}/tree", "--model-id", 'x", default=__import__("os").system("id")) #'],
                                  ["--model-id", "not a hub id"]),
    "export-model-id-with-a-new-line": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                         "{t}/tree", "--model-id", "org/name\nimport os"], ["not a hub id"]),
    "export-model-id-traversal": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                   "{t}/tree", "--model-id", "../../etc"], ["not a hub id"]),
    "export-tree-registers-the-name": (["export", "--model", "zoo:flux", "--integration", "{t}/flux_as_new.py",
                                        "--to", "{t}/tree", "--out", "{t}/out"], ["already registers 'Flux'"]),
    "export-tree-file-linked-out": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                     "{t}/tree-linked-file", "--out", "{t}/out"], ["examples.py is a symbolic link"]),
    "export-tree-package-linked": (["export", "--model", "zoo:flux", "--integration", "{t}/plugin.py", "--to",
                                    "{t}/tree-linked-package", "--out", "{t}/out"], ["cache_dit is a symbolic link"]),
    "inspect-config-lies-about-its-weights": (["inspect", "{t}/weights-lie"],  # was a traceback, exit 1
                                              ["component text_encoder do not match its config.json"]),
    "run-config-lies-about-its-weights": (["run", "{t}/weights-lie", "--rows", "cache", "--twin", "off", "--out",
                                           "{t}/out"],  # every row was an ERROR, exit 1, its folder left behind
                                          ["component text_encoder do not match its config.json"]),

    # twin: configs that lie, and a link out of the model folder (the twin copies files: it would copy the target)
    "twin-config-vocab-below-the-tokenizer": (["twin", "{t}/vocab-lies", "{t}/out"],
                                              ["vocab_size is 8", "tokenizer has"]),
    "twin-config-billion-layers": (["twin", "{t}/layers-lie", "{t}/out"], ["1,000,000,000"]),
    "twin-config-negative-heads": (["twin", "{t}/heads-lie", "{t}/out"], ["does not build", "negative dimension"]),
    "twin-file-linked-out-of-the-folder": (["twin", "{t}/linked-config", "{t}/out"],
                                           ["scheduler_config.json is a symbolic link out of the model folder"]),
    # gate: what an array holds, said as such; hints name the command's own options, never the library's keywords
    "gate-empty-array": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/empty.npy"],
                         ["holds an empty array", "!looks like"]),
    "gate-scalar-array": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/scalar.npy"], ["a single number"]),
    "gate-scalar-pair": (["gate", "--phase", "cp", "{t}/scalar.npy", "{t}/scalar.npy"], ["a single number"]),
    "gate-text-array": (["gate", "--phase", "cp", "{t}/text.npy", "{t}/ok.png"], ["not numbers"]),
    "gate-channels-first-beside-an-image": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/chw.npy"],
                                            ["(3, 32, 32) array", "channels-first", "--modality", "!looks like"]),
    "gate-integer-image-array": (["gate", "--phase", "cp", "{t}/int-image.npy", "{t}/int-image.npy"],
                                 ["--value-range LOW HIGH", "!value_range="]),
    "gate-image-array-beyond-0-1": (["gate", "--phase", "cp", "{t}/wide-image.npy", "{t}/wide-image.npy"],
                                    ["--value-range", "!value_range="]),
    "gate-ambiguous-layout": (["gate", "--phase", "cp", "{t}/tiny-square.npy", "{t}/tiny-square.npy", "--modality",
                               "image"], ["channels last", "!layout="]),
    "gate-audio-array-without-rate": (["gate", "--phase", "cp", "{t}/wave.npy", "{t}/wave.npy", "--modality",
                                       "audio"], ["--sample-rate", "!sample_rate="]),
    "gate-value-range-on-image-files": (["gate", "--phase", "cp", "{t}/ok.png", "{t}/ok.png", "--value-range", "0",
                                         "255"], ["--value-range applies to"]),
    "gate-value-range-upside-down": (["gate", "--phase", "cp", "{t}/wide-image.npy", "{t}/wide-image.npy",
                                      "--value-range", "255", "0"], ["HIGH must be above LOW"]),
    "gate-floor-on-latents": (["gate", "--phase", "cp", "{t}/ok.npy", "{t}/ok.npy", "--floor", "psnr=3"],
                              ["--floor sets", "!floor="]),
    # skill sources holding links out of the skill: refused, nothing installed
    "skill-link-to-a-file-outside": (["skill", "install", "--target", "{t}/project", "--source",
                                      "{t}/skill-linked-file"], ["references/x.md is a link out of the skill"]),
    "skill-link-to-a-folder-outside": (["skill", "install", "--target", "{t}/project", "--source",
                                        "{t}/skill-linked-folder"], ["examples is a link out of the skill"]),
    "skill-skill-md-linked-outside": (["skill", "install", "--target", "{t}/project", "--source",
                                       "{t}/skill-linked-md"], ["SKILL.md is a link out of the skill"]),
    "skill-link-outside-with-link-mode": (["skill", "install", "--target", "{t}/project", "--link", "--source",
                                           "{t}/skill-linked-file"], ["references/x.md is a link out"]),
    "skill-broken-link-with-link-mode": (["skill", "install", "--target", "{t}/project", "--link", "--source",
                                          "{t}/skill-src"], ["references/gone.md is a broken link"]),
    # --resume into a run folder holding links that point out of it
    "run-resume-linked-row-folder": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/linked-row", "--resume"],
                                     ["rows/cache is a symbolic link", "only inside its folder"]),
    "run-resume-linked-result": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/linked-result", "--resume"],
                                 ["result.json is a symbolic link"]),
    "run-resume-linked-lock": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/linked-lock", "--resume"],
                               [".lock is a symbolic link"]),
    "checklist-from-run-with-a-linked-row": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out",
                                              "--from-run", "{t}/linked-row"],
                                             ["cannot copy the rows of", "rows/cache is a symbolic link"]),
    "checklist-from-run-with-a-linked-result": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out",
                                                 "--from-run", "{t}/linked-result"], ["result.json is a symbolic link"]),
    "run-linked-lock-without-resume": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/linked-lock"],
                                       [".lock is a symbolic link"]),
    # --junit FILE that cannot be written at the end: refused before any row runs
    "run-junit-a-folder": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--junit", "{t}/empty"],
                           ["--junit", "is a folder"]),
    "run-junit-missing-folder": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--junit",
                                  "{t}/nope/run.xml"], ["--junit", "does not exist"]),
    "run-junit-under-a-file": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--junit",
                                "{t}/a-file/run.xml"], ["--junit", "is not a folder"]),
    "run-junit-read-only": (["run", "zoo:flux", "--rows", "cache", "--out", "{t}/out", "--junit", "/sys/run.xml"],
                            ["--junit", "cannot write in /sys"]),
    "matrix-junit-a-folder": (["matrix", "zoo:flux", "--out", "{t}/out", "--junit", "{t}/empty"], ["is a folder"]),
    "matrix-junit-read-only": (["matrix", "zoo:flux", "--out", "{t}/out", "--junit", "/sys/m.xml"],
                               ["cannot write in /sys"]),
    "checklist-junit-missing-folder": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out", "--junit",
                                        "{t}/nope/c.xml"], ["does not exist"]),
    "checklist-junit-read-only": (["checklist", "cache", "--model", "zoo:flux", "--out", "{t}/out", "--junit",
                                   "/sys/c.xml"], ["cannot write in /sys"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, files, capsys):
    """A word starting with "!" must not be in the message (an option the command does not have, say)."""
    from ditgate.cli import main

    args, words = CASES[name]
    try:
        try:
            code = main(_fmt(args, files))
        except SystemExit as exc:  # argparse exits 2 by itself, with the usage and one error line
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, (name, code, err[-2000:])
        lines = [line for line in err.splitlines() if line.startswith("ditgate")]
        assert "Traceback" not in err, err
        assert lines, err
        for word in words:
            if word.startswith("!"):
                assert word[1:].format(t=files) not in err, (name, err)
            else:
                assert word.format(t=files) in err, (name, err)
        assert not (files / "out").exists(), "a refused command made its output folder"
        assert not (files / "PWNED").exists(), "loading an input ran code"
        assert (files / "precious.txt").read_text() == PRECIOUS and not any((files / "outside").iterdir())
        assert not (files / "project").exists()
    finally:  # the files are shared by every case: nothing a failing case made reaches the next one
        for made in ("out", "PWNED", "project"):
            if (files / made).is_dir():
                shutil.rmtree(files / made)
            else:
                (files / made).unlink(missing_ok=True)


def test_ditgate_alone_prints_the_help(run_cli):
    code, out, err = run_cli()
    assert code == 0 and "usage: ditgate" in out and "run" in out and not err


def test_argparse_rejections_are_one_line(run_cli, capsys):
    """Values argparse itself refuses (an int that is not one) exit 2 with the usage and one error line."""
    from ditgate.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "zoo:flux", "--warmup", "lots"])
    assert exc.value.code == 2
    assert "invalid int value" in capsys.readouterr().err


@pytest.mark.full
def test_corrupt_result_json_is_run_again(run_cli, tmp_path, flux_default_run):
    """A finished row whose result.json or outputs cannot be read is not kept by --resume: it runs again."""
    import shutil

    report, source = flux_default_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    (out / "rows" / "cache" / "result.json").write_text("{not json")
    (out / "rows" / "baseline" / "output.npy").write_bytes(b"truncated")
    code, stdout, err = run_cli("run", "zoo:flux", "--rows", "cache", "--out", out, "--resume", "--json")
    assert code == 0, err[-3000:]
    rows = {r["name"]: r for r in json.loads(stdout)["rows"]}
    assert not rows["cache"].get("resumed") and not rows["baseline"].get("resumed")
    np.load(out / "rows" / "baseline" / "output.npy")


def test_overwrite_replaces_only_what_ditgate_made(run_cli, tmp_path):
    """`zoo build --overwrite` replaces a model folder it wrote, never a folder of other files."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    code, _, err = run_cli("zoo", "build", "flux", precious, "--overwrite")
    assert code == 2 and "thesis.tex" not in os.listdir(tmp_path) and (precious / "thesis.tex").is_file(), err
    assert "not" in err and str(precious) in err


def test_skill_force_replaces_only_an_installed_skill(run_cli, tmp_path):
    """`skill install --force` replaces an installed skill, never an arbitrary folder of the same name."""
    code, out, err = run_cli("skill", "install", "--target", tmp_path)
    assert code == 0, err
    installed = tmp_path / ".agents" / "skills" / out.split(":")[0]
    (installed / "SKILL.md").unlink()
    (installed / "notes.txt").write_text("not a skill any more")
    code, _, err = run_cli("skill", "install", "--target", tmp_path, "--force")
    assert code == 2 and (installed / "notes.txt").is_file(), err


# Reliability: a run of no row, and user rows named like ditgate's own check rows, are refused before anything runs.
@pytest.mark.parametrize("argv, words", [
    (["run", "zoo:flux", "--rows", ""], "names no row"),
    (["run", "zoo:flux", "--rows", ","], "names no row"),
    (["run", "zoo:flux", "--rows", " , ,"], "names no row"),
    (["matrix", "zoo:flux", "--rows", ""], "names no row"),
    (["run", "zoo:flux", "--rows-file", "{t}/empty.yaml"], "holds no row"),
    (["run", "zoo:flux", "--rows-file", "{t}/empty-mapping.yaml"], "holds no row"),
    (["run", "zoo:flux", "--rows-file", "{t}/sensitivity.yaml"], "reserved"),
    (["run", "zoo:flux", "--rows-file", "{t}/calibration.yaml"], "reserved"),
    (["run", "zoo:flux", "--rows-file", "{t}/baseline.yaml"], "reserved"),
    (["run", "zoo:flux", "--rows-file", "{t}/baseline-tiled.yaml"], "reserved"),
    (["run", "zoo:flux", "--rows-file", "{t}/cache-off.yaml"], "reserved"),
    (["matrix", "zoo:flux", "--rows-file", "{t}/sensitivity.yaml"], "reserved"),
])
def test_no_row_and_reserved_names_are_refused(run_cli, tmp_path, argv, words):
    (tmp_path / "empty.yaml").write_text("[]")
    (tmp_path / "empty-mapping.yaml").write_text("rows: []")
    for name in ("sensitivity", "calibration", "baseline", "baseline-tiled"):
        (tmp_path / f"{name}.yaml").write_text(f"- {{name: {name}, phase: cache, cache: {{Fn_compute_blocks: 1}}}}")
    (tmp_path / "cache-off.yaml").write_text("- {name: cache-cache-off, phase: cache, cache: {Fn_compute_blocks: 1}}")
    out = tmp_path / "out"
    code, stdout, err = run_cli(*[a.replace("{t}", str(tmp_path)) for a in argv], "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert "PASS" not in stdout and not out.exists()


# Every command that takes a model refuses the same bad model options and bad model folders, in one line, before it
# makes its output folder. The table is the product: each command (its other arguments valid) times each bad value.
MODEL_COMMANDS = {
    "run": ["run", "{m}", "--rows", "cache", "--out", "{t}/out"],
    "diff": ["diff", "{m}", "--row", "cp-ulysses-2", "--out", "{t}/out"],
    "inspect": ["inspect", "{m}"],
    "twin": ["twin", "{m}", "{t}/out"],
    "checklist": ["checklist", "cache", "--model", "{m}", "--out", "{t}/out"],
    "matrix": ["matrix", "{m}", "--out", "{t}/out"],
    "scaffold": ["scaffold", "{m}", "--out", "{t}/out"],  # the plugin file it would write
}
BAD_MODEL_OPTIONS = {
    "dtype": (["--dtype", "float99"], "float99"),
    "device": (["--device", "tpu"], "tpu"),
    "height-zero": (["--height", "0"], "height"),
    "height-negative": (["--height", "-8"], "height"),
    "height-overflowing": (["--height", "1" + "0" * 30], "height"),
    "width-zero": (["--width", "0"], "width"),
    "frames-on-an-image-model": (["--frames", "5"], "--frames"),
    "steps-zero": (["--steps", "0"], "steps"),
    "steps-negative": (["--steps", "-3"], "steps"),
    "call-without-value": (["--call", "garbage"], "KEY=VALUE"),
    "call-broken-json": (["--call", "sigmas=[1,"], "not valid JSON"),
    "call-file-missing": (["--call-file", "{t}/nope.json"], "nope.json"),
    "call-file-not-json": (["--call-file", "{t}/bad.json"], "bad.json"),
    "call-file-a-list": (["--call-file", "{t}/list.json"], "list.json"),
    "call-file-height-a-word": (["--call-file", "{t}/call-str.json"], "height"),
    "image-missing": (["--image", "{t}/nope.png"], "--image"),  # zoo:flux takes no image: said first
    "image-not-an-image": (["--image", "{t}/a-file"], "--image"),
    "pipeline-not-installed": (["--pipeline", "nosuchmodule_xyz:X"], "nosuchmodule_xyz"),
    "pipeline-without-module": (["--pipeline", "FluxPipelineX"], "FluxPipelineX"),
    "pipeline-standard-library": (["--pipeline", "os:path"], "os"),
    "call-output-type": (["--call", "output_type=latent"], "output_type"),
    "call-images-per-prompt": (["--call", "num_images_per_prompt=2"], "num_images_per_prompt"),
}
BAD_MODELS = {
    "missing": ("{t}/no-model", "no-model"),
    "a-file": ("{t}/a-file", "a-file"),
    "unknown-zoo-name": ("zoo:nosuch", "nosuch"),
    "index-a-list": ("{t}/list-index", "model_index.json"),
    "index-a-string": ("{t}/string-index", "model_index.json"),
    "empty-folder": ("{t}/empty", "model_index.json"),
    "call-sets-output-type": ("{t}/json-output-type", "output_type"),  # ditgate.json's "call"
}
MODEL_CASES = {
    **{f"{c}-{b}": (c, "zoo:flux", extra, word) for c in MODEL_COMMANDS for b, (extra, word) in
       BAD_MODEL_OPTIONS.items()},
    **{f"{c}-model-{b}": (c, model, [], word) for c in MODEL_COMMANDS for b, (model, word) in BAD_MODELS.items()},
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory, zoo_path):
    t = tmp_path_factory.mktemp("bad-models")
    folder = t / "json-output-type"
    shutil.copytree(zoo_path("flux"), folder, ignore=lambda d, names: [n for n in names if n.endswith(".safetensors")])
    meta = json.loads((folder / "ditgate.json").read_text()) if (folder / "ditgate.json").is_file() else {}
    (folder / "ditgate.json").write_text(json.dumps(meta | {"call": meta.get("call", {}) | {"output_type": "pt"}}))
    (t / "a-file").write_text("a plain file")
    (t / "empty").mkdir()
    for name, text in {"list-index": "[1, 2, 3]", "string-index": '"FluxPipeline"'}.items():
        (t / name).mkdir()
        (t / name / "model_index.json").write_text(text)
    (t / "list.json").write_text("[1, 2]")
    (t / "bad.json").write_text("{not json")
    (t / "call-str.json").write_text('{"height": "tall"}')
    return t


@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_every_model_command_refuses_bad_models_and_options(name, model_files, capsys):
    from ditgate.cli import main

    command, model, extra, word = MODEL_CASES[name]
    argv = [a.format(m=model, t=model_files) for a in MODEL_COMMANDS[command]]
    argv = [a.format(m=model, t=model_files) for a in argv] + [a.format(t=model_files) for a in extra]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, (name, code, err[-2000:])
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("ditgate") and word in lines[-1], (name, err)
    assert len(lines) == 1 or lines[0].startswith("usage:"), ("more than one line", name, err)
    assert not (model_files / "out").exists(), "a refused command made its output folder"


# A full disk says "disk full" and names the file (numpy's own write of a real file said "16384 requested and 7136
# written"). The file system is a small tmpfs, mounted for the test (root only).
@pytest.fixture()
def small_disk(tmp_path):
    import subprocess

    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small file system here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_says_disk_full_with_the_file(small_disk):
    from ditgate.cli import _os_error
    from ditgate.run.exec.files import write_array

    target = small_disk / "rows" / "baseline" / "output.npy"
    with pytest.raises(OSError) as caught:
        write_array(target, np.zeros((64, 64, 64), np.float32))  # 1 MiB on a 64 KiB disk
    message = _os_error(caught.value)
    assert "disk full" in message and str(target) in message and "requested" not in message, message
    assert not list(target.parent.iterdir())  # no half-written file left


@pytest.mark.full
def test_a_run_on_a_full_disk_says_disk_full(small_disk, run_cli):
    code, _, err = run_cli("run", "zoo:flux", "--rows", "cache", "--out", small_disk / "run", "--fresh")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    line = err.strip().splitlines()[-1]
    assert "disk full" in line and str(small_disk / "run") in line and "requested" not in line, err[-2000:]


def test_lint_reports_links_out_of_the_skill_and_broken_links(files, run_cli):
    """The probe's case: `skill install --source` copied what `references/x.md -> /etc/passwd` points at, and lint
    said nothing of it nor of a broken link. Lint names both (rule file-link) and never reads a linked file."""
    code, out, err = run_cli("lint", files / "skill-linked-file", "--json")
    found = {(f["file"], f["rule"]) for f in json.loads(out)["findings"]}
    assert code == 1 and ("references/x.md", "file-link") in found, out
    assert PRECIOUS not in out + err
    code, out, _ = run_cli("lint", files / "skill-src", "--json")
    assert ("references/gone.md", "file-link") in {(f["file"], f["rule"]) for f in json.loads(out)["findings"]}


# The result store (ditgate.run.reuse): an entry whose files were tampered with is never trusted. Each case damages a
# stored entry; the store must answer "nothing stored" (the row is computed again) and remove the entry, and never
# touch what a link points at. A store that cannot be written costs nothing but time.
def _tamper_bytes(entry, outside):
    data = bytearray((entry / "output.npy").read_bytes())
    data[-1] ^= 0xFF
    (entry / "output.npy").unlink()
    (entry / "output.npy").write_bytes(bytes(data))


def _tamper_link(entry, outside):  # same bytes, same size, same hash: but a link out of the store
    outside.write_bytes((entry / "output.npy").read_bytes())
    (entry / "output.npy").unlink()
    (entry / "output.npy").symlink_to(outside)


def _tamper_rehashed(entry, outside):  # the listing rewritten to match a changed result: it says the row failed
    import hashlib

    (entry / "result.json").unlink()
    (entry / "result.json").write_text(json.dumps({"name": "baseline", "status": "error"}))
    meta = json.loads((entry / "entry.json").read_text())
    data = (entry / "result.json").read_bytes()
    meta["files"]["result.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (entry / "entry.json").write_text(json.dumps(meta))


STORE_TAMPERING = {
    "output-changed": _tamper_bytes,
    "output-linked-out-with-the-same-bytes": _tamper_link,
    "output-removed": lambda entry, outside: (entry / "output.npy").unlink(),
    "output-cut-short": lambda entry, outside: os.truncate(entry / "output.npy", 10),
    "extra-file": lambda entry, outside: (entry / "latents.npy").write_bytes(b"planted"),
    "extra-folder": lambda entry, outside: (entry / "sub").mkdir(),
    "listing-not-json": lambda entry, outside: (entry / "entry.json").write_text("{not json"),
    "listing-names-a-path-outside": lambda entry, outside: (entry / "entry.json").write_text(json.dumps(
        {"run": "x", "files": {"../../../outside.npy": {"bytes": 1, "sha256": "0"}}})),
    "result-says-error-rehashed": _tamper_rehashed,
}


@pytest.mark.parametrize("case", sorted(STORE_TAMPERING))
def test_a_tampered_store_entry_is_computed_again(tmp_path, case):
    from ditgate.run.reuse import Store

    run_dir, outside = tmp_path / "run", tmp_path / "outside.npy"
    row = run_dir / "rows" / "baseline"
    row.mkdir(parents=True)
    np.save(row / "output.npy", np.arange(64, dtype=np.float32))
    (row / "result.json").write_text(json.dumps({"name": "baseline", "status": "ok"}))
    store = Store(tmp_path / "store")
    store.put("k", run_dir, "baseline")
    entry = store.root / "entries" / "k"
    assert store.get("k", tmp_path / "sound", "baseline") is not None  # sound before the damage
    STORE_TAMPERING[case](entry, outside)
    kept = outside.read_bytes() if outside.exists() else None
    assert store.get("k", tmp_path / "later", "baseline") is None, case
    assert not entry.exists() and not (tmp_path / "later" / "rows" / "baseline" / "result.json").exists()
    assert (outside.read_bytes() if outside.exists() else None) == kept


@pytest.mark.parametrize("root", ["a-file", "under-a-file"])
def test_a_store_that_cannot_be_written_costs_only_time(tmp_path, root):
    from ditgate.run.reuse import Store

    (tmp_path / "a-file").write_text("not a folder")
    run_dir = tmp_path / "run"
    (run_dir / "rows" / "baseline").mkdir(parents=True)
    np.save(run_dir / "rows" / "baseline" / "output.npy", np.zeros(4, np.float32))
    (run_dir / "rows" / "baseline" / "result.json").write_text(json.dumps({"name": "baseline", "status": "ok"}))
    store = Store(tmp_path / "a-file" if root == "a-file" else tmp_path / "a-file" / "store")
    store.put("k", run_dir, "baseline")  # no exception: the run keeps its result
    assert store.get("k", tmp_path / "other", "baseline") is None


# `ditgate serve`: a server folder (or socket) that is not the user's own and private is refused by the server and
# ignored by every client (the command runs in its own process): a folder open to others, owned by another user, a
# link, a file; a socket file that is no socket; a socket another user listens on.
def _serve_home(home: Path, case: str) -> None:
    folder = home / "serve"
    if case == "folder-a-file":
        home.mkdir()
        folder.write_text("not a folder")
        folder.chmod(0o600)
        return
    if case == "folder-a-link":
        (home / "elsewhere").mkdir(parents=True, mode=0o700)
        folder.symlink_to(home / "elsewhere", target_is_directory=True)
        (home / "elsewhere").chmod(0o700)
        return
    folder.mkdir(parents=True)
    folder.chmod(0o755 if case == "folder-open-to-others" else 0o700)
    if case == "folder-of-another-user":
        os.chown(folder, 65534, 65534)
    if case == "socket-a-file":
        (folder / "serve.sock").write_text("not a socket")


SERVE_CASES = ("folder-open-to-others", "folder-of-another-user", "folder-a-link", "folder-a-file", "socket-a-file")


@pytest.mark.parametrize("case", SERVE_CASES)
def test_a_server_folder_not_private_is_refused_and_ignored(tmp_path, monkeypatch, capsys, case):
    from ditgate.cli import main
    from ditgate.commands.tools import serve

    if case == "folder-of-another-user" and os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    home = tmp_path / "home"
    _serve_home(home, case)
    monkeypatch.setenv("DITGATE_HOME", str(home))
    assert serve.forward(["zoo", "list"]) is None  # ignored: the command runs in its own process
    if case == "socket-a-file":
        return  # a private folder: a server may start there (it replaces the stale file)
    code = main(["serve", "--idle", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "private folder" in err, err
    assert not (home / "serve" / "serve.sock").is_socket() if (home / "serve").is_dir() else True


def test_a_socket_another_user_listens_on_is_ignored(tmp_path, monkeypatch):
    """A socket in the user's private server folder whose listener runs as another user (its credentials, read
    with SO_PEERCRED, are not the user's) is never handed a command."""
    import socket

    from ditgate.commands.tools import serve

    if os.geteuid() != 0:
        pytest.skip("listening as another user needs root")
    monkeypatch.setenv("DITGATE_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "serve").mkdir(parents=True, mode=0o700)
    (tmp_path / "home" / "serve").chmod(0o700)
    ready, hold = os.pipe()
    child = os.fork()
    if child == 0:  # bind as root, listen as nobody: the socket's peer credentials say nobody
        try:
            os.close(ready)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(serve.socket_path()))
            os.setgid(65534)
            os.setuid(65534)
            listener.listen(1)
            os.write(hold, b"x")
            conn, _ = listener.accept()
            # a server that would "run" whatever it is handed: greets as this ditgate, says started, exit 0
            conn.sendall(json.dumps({"identity": serve.identity(), "pid": os.getpid()}).encode() + b"\n")
            socket.recv_fds(conn, 1 << 20, 3)
            conn.sendall(b'{"started": 1}\n{"rc": 0}\n')
        finally:
            os._exit(0)
    os.close(hold)
    try:
        if os.read(ready, 1) != b"x":  # the child could not change user (a container without CAP_SETUID)
            pytest.skip("cannot listen as another user here")
        assert serve.forward(["zoo", "list"]) is None
    finally:
        os.close(ready)
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
        os.waitpid(child, 0)
