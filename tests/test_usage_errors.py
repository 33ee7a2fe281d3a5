"""Command-line usage errors (an unknown option, a missing argument, an option without its value, an unknown command)
are user errors: one message, exit 2, no traceback. With typer 0.29, which carries its own copy of click, they ended in a
traceback and exit 1, because only click's own exception types were caught."""

import pytest
from conftest import run_cli


@pytest.mark.parametrize(
    "args, says",
    [
        (["build", "m.onnx", "--bogus"], "No such option: --bogus"),
        (["build"], "Missing argument 'ONNX'"),
        (["build", "m.onnx", "--fp8-chain-ffn"], "'--fp8-chain-ffn' requires an argument"),
        (["rebuild"], "No such command 'rebuild'"),
    ],
    ids=["unknown-option", "missing-argument", "option-without-value", "unknown-command"],
)
def test_usage_errors_exit_2_with_one_message(args, says):
    proc = run_cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr[-1500:]


def test_both_click_copies_are_caught():
    import typer

    from trtforge.cli.app import _click_error_types

    usage_errors, aborts = _click_error_types()
    assert isinstance(typer.BadParameter("x"), usage_errors) and typer.Abort in aborts
