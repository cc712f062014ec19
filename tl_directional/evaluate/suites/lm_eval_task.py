"""Evaluate an edited ``transformers`` model with lm-evaluation-harness (``lm_eval``'s Python API).

:func:`evaluate_edited` wraps the model in ``lm_eval``'s ``HFLM``, installs the edits
(:func:`tl_directional.apply_edits`) for the evaluation only and runs ``simple_evaluate`` on
local tasks. The bundled task ``tld_kjv_cloze`` (:data:`TASK_NAME`, in :func:`task_dir`) is an
80-item, 4-way cloze on the held-out KJV text built by ``studies/data/make_lm_eval_task.py`` (seed 0);
its data ships in the package, so evaluation runs offline. ``lm_eval`` is imported only here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...edit import Edit
from ...edit.apply import apply_edits

TASK_NAME = "tld_kjv_cloze"
_REQUIRED_KEYS = ("task", "output_type", "doc_to_text", "doc_to_choice", "doc_to_target")


def task_dir() -> Path:
    """The directory of the bundled ``tld_kjv_cloze`` task (YAML, loader, data)."""
    from importlib import resources

    return Path(str(resources.files("tl_directional") / "data" / "lm_eval" / TASK_NAME))


def check_task_dir(path: str | os.PathLike[str], tasks: Sequence[str]) -> Path:
    """Check that ``path`` holds a YAML for every name in ``tasks`` with the keys a
    multiple-choice task needs; a FileNotFoundError / ValueError naming ``task_dir`` otherwise."""
    import yaml

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"task_dir={str(p)!r} is not a directory; pass the folder holding the task "
                                f"YAML files (the bundled one: tl_directional.evaluate.suites.lm_eval_task.task_dir())")
    found: dict[str, Path] = {}
    for f in sorted(p.rglob("*.yaml")):
        try:
            # lm-eval's YAML uses a !function tag; read it as a plain string here
            loader = type("L", (yaml.SafeLoader,), {})
            loader.add_constructor("!function", lambda ld, node: ld.construct_scalar(node))
            cfg = yaml.load(f.read_text(), Loader=loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as err:
            raise ValueError(f"task_dir={str(p)!r}: {f.name} is not valid YAML ({err}); fix or remove it") from err
        if not isinstance(cfg, dict) or "task" not in cfg:
            raise ValueError(f"task_dir={str(p)!r}: {f.name} has no 'task:' key; every task YAML names its task")
        missing = [k for k in _REQUIRED_KEYS if k not in cfg]
        if missing:
            raise ValueError(f"task_dir={str(p)!r}: task {cfg['task']!r} ({f.name}) lacks {missing}; a "
                             f"multiple-choice task needs {list(_REQUIRED_KEYS)}")
        found[str(cfg["task"])] = f
    unknown = [t for t in tasks if t not in found]
    if unknown:
        raise ValueError(f"tasks={list(tasks)!r}: {unknown} not found in task_dir={str(p)!r}, which defines "
                         f"{sorted(found)}")
    return p


def evaluate_edited(model: Any, tokenizer: Any, edits: Sequence[Edit] = (), *,
                    tasks: Sequence[str] = (TASK_NAME,), task_dir_: str | os.PathLike[str] | None = None,
                    batch_size: int = 8, limit: int | None = None, log_samples: bool = False) -> dict[str, Any]:
    """Zero-shot ``lm_eval`` accuracy of ``model`` with ``edits`` active (none: the unedited model).

    Args:
        model: a plain ``transformers`` causal LM (eager attention for pattern edits).
        tokenizer: its tokenizer.
        edits: tl_directional edits, installed for the evaluation and removed afterwards.
        tasks: task names defined in ``task_dir_`` (default: the bundled ``tld_kjv_cloze``).
        task_dir_: folder of task YAMLs (default :func:`task_dir`).
        batch_size: ``HFLM`` batch size.
        limit: evaluate only the first ``limit`` items of each task.
        log_samples: keep per-item results under ``"samples"``.

    Returns:
        ``{"acc": {task: accuracy}, "results": simple_evaluate's dict}``.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks = list(tasks)
    path = check_task_dir(task_dir() if task_dir_ is None else task_dir_, tasks)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    manager = TaskManager(include_path=str(path), include_defaults=False)

    def run():
        return simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=0, limit=limit,
                               bootstrap_iters=0, log_samples=log_samples, random_seed=0, numpy_random_seed=0,
                               torch_random_seed=0, fewshot_random_seed=0)

    if edits:
        with apply_edits(model, *edits):
            results = run()
    else:
        results = run()
    acc = {t: float(results["results"][t]["acc,none"]) for t in tasks}
    return {"acc": acc, "results": results}


__all__ = ["TASK_NAME", "check_task_dir", "evaluate_edited", "task_dir"]
