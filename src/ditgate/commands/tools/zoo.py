"""`ditgate zoo list [--pipelines] [--json] | build NAME DIR`."""

from __future__ import annotations

import argparse
import json

HELP = "list the offline tiny models, or build one into a folder"


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="list the zoo models")
    listing.add_argument("--pipelines", action="store_true",
                         help="list the tiny copies of real diffusers pipelines (zoo:pipe/NAME) instead")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    build = sub.add_parser("build", help="build a zoo model and save it with save_pretrained")
    build.add_argument("name", help="zoo model name (see `ditgate zoo list`)")
    build.add_argument("directory", help="folder to write; must be empty or absent unless --overwrite")
    build.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    build.add_argument("--overwrite", action="store_true", help="replace an existing folder")


def main(args: argparse.Namespace) -> int:
    from ditgate import zoo

    if args.zoo_command == "list":
        models = zoo.PIPELINES if args.pipelines else zoo.ZOO
        if args.json:
            print(json.dumps([{"name": f"zoo:{m.name}", "pipeline": m.pipeline, "modality": m.modality,
                               "summary": m.summary, "call": m.call} for m in models.values()], indent=2, default=str))
            return 0
        width, cls_width = max(map(len, models)), max(len(m.pipeline) for m in models.values())
        for model in models.values():
            print(f"zoo:{model.name:<{width}}  {model.pipeline:<{cls_width}} {model.modality:<6} {model.summary}")
        return 0
    path = zoo.build(args.name, args.directory, seed=args.seed, overwrite=args.overwrite)
    print(f"built zoo:{zoo.get(args.name).name} (seed {args.seed}) in {path}")
    return 0
