"""Build time and one baseline run of every zoo model at its default size, each in a fresh process.

    python benchmarks/zoo_times.py [--models flux,wan] [--json FILE]

For each model, one child process (so no model profits from another's imports or warm caches) times:
- `import`: importing diffusers, cache-dit and ditgate's runtime;
- `build`: building the seeded pipeline and writing it with `save_pretrained` (`ditgate zoo build`);
- `load`: `ditgate.load` of the written folder;
- `run`: one call at the zoo's default request (8 steps), as `ditgate run`'s baseline row makes it.
Also reports the folder's size on disk and the parameter count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import diffusers, cache_dit  # noqa: F401
from ditgate import load, zoo
from ditgate.core import request
from ditgate.run.exec.execute import generate
from ditgate.run.exec.probes import Probes
t1 = time.perf_counter()
name, folder = sys.argv[1], sys.argv[2]
path = zoo.build(name, folder)
t2 = time.perf_counter()
pipe = load(path)
t3 = time.perf_counter()
generate(pipe, request.build(zoo.read_meta(path)), Probes().attach(pipe))
t4 = time.perf_counter()
size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
params = sum(p.numel() for m in pipe.components.values() if hasattr(m, "parameters") for p in m.parameters())
print(json.dumps({"model": name, "import_s": t1 - t0, "build_s": t2 - t1, "load_s": t3 - t2, "run_s": t4 - t3,
                  "steps": zoo.read_meta(path)["call"].get("num_inference_steps"), "bytes": size, "parameters": params}))
"""


def main() -> None:
    from ditgate import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.names()))
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    results = []
    print("| model | import (s) | build + save (s) | load (s) | one call (s) | steps | size (MB) | parameters |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run([sys.executable, "-c", CHILD, name, f"{tmp}/{name}"], capture_output=True,
                                  text=True, check=False)
        if done.returncode:
            sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"| zoo:{name} | {r['import_s']:.1f} | {r['build_s']:.2f} | {r['load_s']:.2f} | {r['run_s']:.2f} | "
              f"{r['steps']} | {r['bytes'] / 1e6:.1f} | {r['parameters'] / 1e6:.2f} M |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
