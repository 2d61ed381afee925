"""``captioner config``: print a resolved config (defaults, file, overrides), the reference of every setting, or
the recipes that ship with captioner."""

from __future__ import annotations

import argparse

from captioner.commands.options import add_overrides


def add_parser(commands) -> None:
    parser = commands.add_parser("config", help="print a resolved config (defaults, file, overrides), the reference "
                                 "or the packaged recipes")
    parser.add_argument("config", nargs="?", help="YAML config or a recipe's name (default: the built-in defaults)")
    add_overrides(parser)
    parser.add_argument("--reference", action="store_true", help="every setting, its default and meaning (Markdown)")
    parser.add_argument("--list", action="store_true", help="the recipes that ship with captioner, by name (every "
                        "command that takes a CONFIG takes a name: captioner train coco_soft)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from captioner.config import RECIPE_DIR, config_reference, load_config, recipe_summary, recipes

    if args.reference:
        print(config_reference(), end="")
        return 0
    if args.list:
        shipped = recipes()
        width = max(map(len, shipped))
        for name, path in shipped.items():
            print(f"{name:<{width}}  {recipe_summary(path)}")
        print(f"\n(in {RECIPE_DIR}; any command that takes a CONFIG takes a recipe's name)")
        return 0
    print(yaml.safe_dump(load_config(args.config, args.overrides).to_dict(), sort_keys=False), end="")
    return 0
