"""The `specpilot` command. Each subcommand lives in its own `cli_*.py` module and registers
itself with `add_parser(subparsers)`; its handler returns an exit code.

User errors (`SpecPilotError`) are printed as one line on stderr with exit code 2, never as a
traceback; anything else is a bug and keeps its traceback.
"""
import argparse
import importlib
import sys

# (module, description) — imported lazily so `specpilot --help` stays fast.
SUBCOMMAND_MODULES = [
    "specpilot.cli_demo",
    "specpilot.cli_ir",
    "specpilot.cli_generate",
    "specpilot.cli_force",
    "specpilot.cli_zoo",
    "specpilot.cli_bench",
    "specpilot.cli_cost",
    "specpilot.cli_compile",
    "specpilot.cli_report",
    "specpilot.cli_export",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specpilot",
        description="Compile a tuned, token-forced speculative decoder for a target/drafter/GPU triple.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not built yet
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    from specpilot.ir.errors import SpecPilotError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
    except SpecPilotError as exc:
        print(f"specpilot {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specpilot {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
