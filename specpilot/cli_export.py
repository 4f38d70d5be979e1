"""`specpilot export`: write a Program's generated kernels as a self-contained folder."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a Program's generated kernels to a folder",
                       description="Lower the Program, render every kernel of its plan and write "
                                   "them with the Program, the plan, a loader module and a README "
                                   "to DIR, which then works without SpecPilot installed. The "
                                   "folder appears atomically; the same Program gives the same "
                                   "bytes.")
    p.add_argument("program", metavar="PROGRAM",
                   help="Program JSON file, or a folder holding program.json (a round's output)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to create")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists and is not empty")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specpilot.codegen.export import export_program
    from specpilot.ir import load_program

    result = export_program(load_program(args.program), args.out, force=args.force)
    print(f"exported {len(result.plan.kernels)} kernels for {len(result.plan.nodes)} nodes "
          f"to {result.path}")
    return 0
