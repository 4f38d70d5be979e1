"""The package installs with its namespace mapping and the CLI answers --help everywhere."""
import subprocess
import sys

import pytest

from specpilot.cli import build_parser, main


def test_namespace_mapping_points_at_top_level_folders():
    import specpilot.ir
    import specpilot.runtime
    import specpilot.codegen
    for mod, folder in ((specpilot.ir, "ir"), (specpilot.runtime, "runtime"), (specpilot.codegen, "codegen")):
        assert mod.__file__.replace("\\", "/").split("/")[-2] == folder


def test_importing_ir_pulls_in_no_orchestration_or_torch_kernels():
    code = ("import sys, specpilot.ir; "
            "bad = [m for m in sys.modules if m.startswith(('specpilot.cli', 'specpilot.zoo', 'triton'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in _subcommands()])
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out
