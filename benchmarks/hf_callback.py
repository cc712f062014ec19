"""Step-time overhead of :class:`tl_directional.training.hf_callback.DirectionalEditCallback` (standalone).

``transformers.Trainer`` steps (forward, backward, AdamW) on the bundled default model (4-layer
GPT-2, d_model 256) with batches of 8 x 64 tokens, CPU, one thread. Configurations, each timed on
its own fresh model (median step time after warm-up, rounds interleaved):

* ``none``: no edit;
* ``installed``: ``ValueScale(0.0)`` installed by hand (``tl_directional.edit.hf.install_edits``);
* ``callback``: the same edit through the callback (no schedule, no logging);
* ``callback+log10``: with the parallel share measured and logged every 10 steps;
* ``callback+sched+log10``: with a linear warm-up schedule as well (edits re-installed every step).

The callback's own cost is ``callback* / installed``; the edit's cost is ``installed / none``.

    OMP_NUM_THREADS=1 python benchmarks/hf_callback.py --steps 12 --warmup 3 --rounds 2 --out result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch


def measure(steps: int = 30, warmup: int = 5, rounds: int = 3, batch: int = 8, seq_len: int = 64) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from tl_directional.edit import ValueScale
    from tl_directional.edit.hf import install_edits
    from tl_directional.model.load import default_model_dir, load_hf_model
    from tl_directional.training.hf_callback import DirectionalEditCallback, SparSchedule
    from tl_directional.training.hf_recipe import TokenWindows, token_windows

    torch.set_num_threads(1)
    d = default_model_dir()
    ids = token_windows(d, n_seqs=batch * 4, seq_len=seq_len, seed=0)
    data = TokenWindows(ids)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    def run(config: str) -> list[float]:
        model = load_hf_model(d).train()
        handle = install_edits(model, ValueScale(0.0)) if config == "installed" else None
        callbacks = []
        if config == "callback":
            callbacks.append(DirectionalEditCallback(ValueScale(0.0)))
        elif config == "callback+log10":
            callbacks.append(DirectionalEditCallback(ValueScale(0.0), log_every=10))
        elif config == "callback+sched+log10":
            callbacks.append(DirectionalEditCallback(ValueScale(0.0), schedule=SparSchedule(1.0, 0.0, steps),
                                                     log_every=10))
        timer = Timer()  # last, so its on_step_begin runs after the callback's (re-install included)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, max_steps=steps + warmup, per_device_train_batch_size=batch,
                                     learning_rate=1e-4, logging_steps=10, save_strategy="no", report_to=[],
                                     use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
            # callback first: the timer's on_step_begin must see the schedule's re-install included
            Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, timer]).train()
        if handle is not None:
            handle.remove()
        return timer.times[warmup:]

    configs = ["none", "installed", "callback", "callback+log10", "callback+sched+log10"]
    samples: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            samples[c] += run(c)
    med = {c: statistics.median(v) for c, v in samples.items()}
    return {
        "median_step_s": med,
        "edit_cost_installed_over_none": med["installed"] / med["none"],
        "callback_over_installed": {c: med[c] / med["installed"] for c in configs[2:]},
        "steps_per_config": len(samples["none"]),
        "batch": batch, "seq_len": seq_len, "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the JSON result here")
    a = ap.parse_args()
    text = json.dumps(measure(a.steps, a.warmup, a.rounds), indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
