"""Standalone training-step timing (not a record): a training step with a variant's edit active
against the same step without it, on one :class:`tl_directional.training.Trainer`.

The registered record is ``train_step_overhead`` in :mod:`benchmarks.planned`; this helper is for
quick looks from a notebook or a shell (``python -c "from benchmarks.training import
step_time_ratio; print(step_time_ratio())"``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tl_directional.edit import edit_hooks
from tl_directional.training import TrainConfig, Trainer, variant_edits


def step_time_ratio(*, n_steps: int = 5, warmup: int = 2, variant: str = "vpara",
                    cfg: TrainConfig | None = None, run_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, float]:
    """Training-step time with ``variant``'s edit active / baseline step time.

    Same model stack, same process, same batch: one :class:`Trainer` is built, and its hooks are
    swapped between the two timings (interleaved, median of ``n_steps`` each).
    """
    cfg = cfg or TrainConfig(max_steps=1000, eval_windows=1, batch_size=8)
    own = run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="tld-bench-")) if own else Path(run_dir)
    try:
        trainer = Trainer(cfg, run_dir)
        tokens = trainer.batch(0)
        edited = edit_hooks(trainer.model, *variant_edits(variant))
        times: dict[str, list[float]] = {"baseline": [], variant: []}

        def one(hooks):
            trainer.model.train()
            t = time.perf_counter()
            with trainer.model.hooks(fwd_hooks=hooks):
                loss = trainer.model(tokens, return_type="loss")
            loss.backward()
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - t

        for i in range(warmup + n_steps):
            for name, hooks in (("baseline", []), (variant, edited)):
                dt = one(hooks)
                if i >= warmup:
                    times[name].append(dt)
        base = statistics.median(times["baseline"])
        other = statistics.median(times[variant])
        return {"baseline_s": base, f"{variant}_s": other, "ratio": other / base,
                "tokens_per_step": int(tokens.numel())}
    finally:
        if own:
            shutil.rmtree(run_dir, ignore_errors=True)
