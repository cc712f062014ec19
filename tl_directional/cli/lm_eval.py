"""``tl-directional-lm-eval``: lm-evaluation-harness's own command line, with the ``tl-directional``
model registered and the bundled tasks on the task path.

lm-eval 0.4.13 discovers models only from its own package (``lm_eval --model NAME`` looks NAME up
in a registry that nothing outside lm-eval fills before the command runs: no entry points, no
``--include_package``). This launcher imports :mod:`tl_directional.evaluate.suites.lm_eval_model` (which
registers ``tl-directional``) and then runs lm-eval's ``cli_evaluate`` on the same arguments, so
every lm-eval option works as documented there::

    tl-directional-lm-eval --model tl-directional \\
        --model_args 'pretrained=default,edits=value[s_par=0,s_perp=1,L=all]' \\
        --tasks tld_kjv_cloze --batch_size 8 --device cpu

(``python -m tl_directional.cli.lm_eval`` is the same command.) The bundled task folder
(``tl_directional/data/lm_eval``) is the ``--include_path`` unless the command names another
folder (lm-eval 0.4.13 takes one). A bad ``edits`` / ``pretrained`` / ``dtype`` value is one ``error:``
line and exit status 2; everything else behaves as lm-eval's command line does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def _with_bundled_tasks(argv: list[str]) -> list[str]:
    """``argv`` with ``--include_path`` set to the bundled task folder where it names none
    (lm-eval 0.4.13 takes one folder there; one given by the user is left as it is)."""
    from ..evaluate.suites.lm_eval_task import task_dir

    if any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
        return list(argv)
    return [*argv, "--include_path", str(task_dir().parent)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run lm-eval's command line on ``argv`` (default ``sys.argv[1:]``) with ``tl-directional``
    registered; returns the exit status."""
    from lm_eval.__main__ import cli_evaluate

    from ..evaluate.suites.lm_eval_model import ModelArgsError  # importing it registers the model
    from ..evaluate.sweeps.edit_spec import EditSpecError

    args = _with_bundled_tasks(list(sys.argv[1:] if argv is None else argv))
    saved = sys.argv
    sys.argv = [saved[0] if saved else "tl-directional-lm-eval", *args]
    try:
        cli_evaluate()
    except (EditSpecError, ModelArgsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
