"""Records of features built after the harness: sweeps, training, compression checks.

Until a feature's module (and the function the record calls) exists, its record is emitted
with ``status: "not_available"`` and the reason (which import or attribute is missing), with
its name and target, so the JSON always carries every contract name. Availability is detected
by importing the module and looking the names up; once they exist, the record runs. The calls
below follow the API described here; if the real API changes, the record comes out as
``status: "error"`` with the exception, and only the lines marked ``ADJUST HERE`` need editing.

APIs used (keyword arguments a function does not accept are dropped, see ``_call``):

``sweep_cost`` (target <= 1.05; ``sweep_shared_prefix`` <= 0.80 with edits from the middle layer on)
    ``tl_directional.evaluate.sweeps.runner.sweep(model, inputs, edits_grid, *, batch_size, progress=False)``
    evaluates the unedited model plus every setting of ``edits_grid`` on ``inputs`` and returns
    one row per setting (baseline first). The grid is ``grid("value", s_par=S)`` with K = 8
    non-identity V-Para scales ``S`` (a list of ``ValueScale`` edits if ``grid`` is missing);
    ``stack`` is left at the sweep's default. Baseline: 9 plain forwards of the same batch
    (logits), what evaluating baseline + 8 settings one forward each costs.

``train_step_overhead`` (target <= 1.10)
    ``tl_directional.training``: ``TrainConfig(variant="vpara", n_layers, d_model, n_heads, n_ctx,
    batch_size, vocab_size, tokenizer=DIR, ...)``, ``Trainer(cfg, run_dir, device=...)`` whose
    ``train_step(step)`` runs forward (next-token loss) + backward + AdamW step with the
    forward hooks in ``trainer.hooks`` active (the variant's edits, METHOD.md sec. 7).
    Candidate: ``train_step(0)`` with the ``vpara`` hooks (V-Para removal, every layer and
    head); baseline: the same trainer and step with ``trainer.hooks = []``. The trainer builds
    its own seeded GPT-2 of the main model's shape (float32) in a temporary run directory,
    with the main model's tokenizer.

``compression_local_cost`` (target <= 2.0)
    ``tl_directional.compression.compression_geometry(dense, compressed, inputs, *,
    mode="local", batch_size, verify=False, progress=False)``: the local (one layer at a time)
    comparison of METHOD.md sec. 6 over every layer and every unit the model defines, on one
    batch (one dense forward recording each unit's input, then compressed forwards fed those
    inputs; twice when both ``mlp`` and ``block`` are measured). ``verify`` is off in the timed
    call, as for ``profile``. The compressed model is
    ``tl_directional.compression.compressors.prune_magnitude(dense, 0.5).model`` (50 % unstructured magnitude
    pruning of every attention and MLP linear). Baseline: one plain forward of the dense
    model on the batch (``return_type=None``, as for ``profile_overhead``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import shutil
import tempfile
from pathlib import Path

from tl_directional import ValueScale

from .floors import compression_local_floor
from .registry import Bench, NotAvailable, register
from .shapes import Shape
from .workloads import forward

#: Number of edit settings in the sweep record (plus the unedited baseline).
SWEEP_K = 8
#: The K V-Para scales of the sweep (identity s_par = 1 excluded).
SWEEP_S_PAR = (0.0, 0.25, 0.5, 0.75, 1.25, 1.5, 1.75, 2.0)


def _require(module: str, *names: str):
    """Import ``module`` and return it, or raise :class:`NotAvailable` if the module or any of
    ``names`` is missing."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise NotAvailable(f"feature module {module} is missing (not built yet)")
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise NotAvailable(f"{module} has no {', '.join(missing)} (the API this record uses; "
                           "the feature is not built yet)")
    return mod


def _call(fn, *args, **kwargs):
    """Call ``fn`` with the keyword arguments its signature accepts (all of them if it takes
    ``**kwargs``), so optional extras do not break a slightly different signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def _check_slice(batch):
    """The first 2 sequences x 32 tokens of ``batch``: where the shared-prefix sweeps are checked
    against full forwards (the same code path as the whole batch at a fraction of its cost;
    on a real model the full-forward sweep of the whole batch is minutes)."""
    from tl_directional.model.inputs import TokenBatch

    n = min(32, batch.tokens.shape[1])
    return TokenBatch(batch.tokens[:2, :n].contiguous(), batch.attention_mask[:2, :n].contiguous())


@register(
    "sweep_cost", target=1.05, op="<=", precision=0.05, floor_pairs=3,
    baseline=f"{SWEEP_K + 1} plain forwards of the batch (baseline + {SWEEP_K} settings)",
    candidate=f"sweep(model, batch, grid('value', s_par=<{SWEEP_K} values>), "
              "batch_size=len(batch), progress=False)",
)
def sweep_cost(bench: Bench):
    """A sweep over the unedited model plus K = 8 V-Para settings / 9 plain forwards of the
    same batch."""
    mod = _require("tl_directional.evaluate.sweeps.runner", "sweep")
    model, batch = bench.model, bench.inputs
    # ADJUST HERE if the sweep API changes.
    if hasattr(mod, "grid"):
        settings = mod.grid("value", s_par=SWEEP_S_PAR)
    else:
        settings = [ValueScale(s_par=s) for s in SWEEP_S_PAR]

    def cand():
        return _call(mod.sweep, model, batch, settings, batch_size=len(batch), progress=False)

    if bench.check:  # on a slice: the same code path, without a minutes-long extra sweep
        part = _check_slice(batch)
        result = _call(mod.sweep, model, part, settings, batch_size=len(part), progress=False)
        bench.extra["k_settings"] = len(settings)
        bench.extra["s_par"] = list(SWEEP_S_PAR)
        bench.extra["check_result_rows"] = len(result) if hasattr(result, "__len__") else None
        bench.extra["check_on"] = f"{part.tokens.shape[0]} sequences x {part.tokens.shape[1]} tokens"
        del result

    def base():
        for _ in range(SWEEP_K + 1):
            forward(model, batch, "logits")

    return bench.measure(base, cand, one=lambda: forward(model, batch, "logits"), repeat=SWEEP_K + 1)


@register(
    "sweep_shared_prefix", target=0.80, op="<=", precision=0.05, floor_pairs=3,
    baseline=f"{SWEEP_K + 1} plain forwards of the batch (baseline + {SWEEP_K} settings)",
    candidate=f"sweep(model, batch, grid('value', s_par=<{SWEEP_K} values>, layers=[middle..last]), "
              "shared_prefix=True): the unedited prefix runs once per batch",
)
def sweep_shared_prefix(bench: Bench):
    """The sweep of ``sweep_cost`` with edits from the middle layer on, running blocks before it
    once per batch and branching every setting from the recorded residual / 9 plain forwards.
    ``extra.check_max_abs_delta_loss_diff`` compares it with the full-forward sweep."""
    mod = _require("tl_directional.evaluate.sweeps.runner", "sweep", "grid")
    if "shared_prefix" not in inspect.signature(mod.sweep).parameters:
        raise NotAvailable("tl_directional.evaluate.sweeps.runner.sweep has no shared_prefix argument")
    model, batch = bench.model, bench.inputs
    n_layers = int(model.cfg.n_layers)
    start = n_layers // 2
    settings = mod.grid("value", s_par=SWEEP_S_PAR, layers=[list(range(start, n_layers))])

    def cand():
        return mod.sweep(model, batch, settings, batch_size=len(batch), progress=False,
                         shared_prefix=True)

    bench.extra["first_edited_layer"] = start
    bench.extra["n_layers"] = n_layers
    if bench.check:  # on a slice: the same code path, without minutes-long extra sweeps
        part = _check_slice(batch)
        shared = mod.sweep(model, part, settings, batch_size=len(part), progress=False, shared_prefix=True)
        bench.extra["check_result_rows"] = len(shared)
        full = mod.sweep(model, part, settings, batch_size=len(part), progress=False)
        bench.extra["check_max_abs_delta_loss_diff"] = float(
            (shared["delta_loss"] - full["delta_loss"]).abs().max())
        bench.extra["check_on"] = f"{part.tokens.shape[0]} sequences x {part.tokens.shape[1]} tokens"

    def base():
        for _ in range(SWEEP_K + 1):
            forward(model, batch, "logits")

    return bench.measure(base, cand, one=lambda: forward(model, batch, "logits"), repeat=SWEEP_K + 1)


@register(
    "layer_sweep_shared_prefix", target=0.60, op="<=", precision=0.05, floor_pairs=3,
    baseline="n_layers + 1 plain forwards of the batch (baseline + one setting per layer)",
    candidate="sweep(model, batch, grid('value', s_par=0.0, layers=[[0], [1], ..., [n_layers - 1]]), "
              "shared_prefix=True): each layer's setting starts at its block",
)
def layer_sweep_shared_prefix(bench: Bench):
    """A per-layer sweep (every layer, one space, one scale: V-Para removal) with each
    setting's forward starting at its own layer from the residual recorded in the baseline
    forward / ``n_layers + 1`` plain forwards. ``extra.check_max_abs_delta_loss_diff`` compares it
    with the same sweep run as full forwards."""
    mod = _require("tl_directional.evaluate.sweeps.runner", "sweep", "grid")
    if "shared_prefix" not in inspect.signature(mod.sweep).parameters:
        raise NotAvailable("tl_directional.evaluate.sweeps.runner.sweep has no shared_prefix argument")
    model, batch = bench.model, bench.inputs
    n_layers = int(model.cfg.n_layers)
    settings = mod.grid("value", s_par=0.0, layers=[[L] for L in range(n_layers)])

    def cand():
        return mod.sweep(model, batch, settings, batch_size=len(batch), progress=False, shared_prefix=True)

    bench.extra["n_layers"] = n_layers
    if bench.check:  # on a slice: the same code path, without minutes-long extra sweeps
        part = _check_slice(batch)
        shared = mod.sweep(model, part, settings, batch_size=len(part), progress=False, shared_prefix=True)
        bench.extra["check_result_rows"] = len(shared)
        full = mod.sweep(model, part, settings, batch_size=len(part), progress=False)
        bench.extra["check_max_abs_delta_loss_diff"] = float((shared["delta_loss"] - full["delta_loss"]).abs().max())
        bench.extra["check_on"] = f"{part.tokens.shape[0]} sequences x {part.tokens.shape[1]} tokens"

    def base():
        for _ in range(n_layers + 1):
            forward(model, batch, "logits")

    # the scaled baseline (real models) counts one forward n_layers + 1 times, as base() runs
    return bench.measure(base, cand, one=lambda: forward(model, batch, "logits"), repeat=n_layers + 1)


def _tokenizer_dir(source: str) -> str | None:
    """The directory holding the main model's tokenizer, if it has one."""
    if source == "default":
        from tl_directional.model.load import default_model_dir

        path = default_model_dir()
    else:
        path = Path(source)
    return str(path) if (path / "tokenizer.json").is_file() else None


@register(
    "train_step_overhead", target=1.10, op="<=", precision=0.10,
    baseline="Trainer.train_step(0) with trainer.hooks = [] (no edit)",
    candidate="the same train_step(0) with the 'vpara' hooks (ValueScale(s_par=0), all layers)",
)
def train_step_overhead(bench: Bench):
    """A training step (forward + backward + AdamW step) with V-Para removal active on every
    layer / the same step of the same trainer without edits."""
    mod = _require("tl_directional.training", "Trainer", "TrainConfig")
    real = bench.harness.config.catalogue_model
    if real:
        raise NotAvailable(
            f"train_step_overhead times the Trainer's own seeded GPT-2 of the main model's shape "
            f"(TrainConfig builds a GPT-2), not {real} (another architecture); run it on the "
            "default model")
    cfg_m = bench.model.cfg
    run_dir = tempfile.mkdtemp(prefix="tl_directional_bench_train_")
    try:
        # ADJUST HERE if the train API changes.
        cfg = mod.TrainConfig(
            variant="vpara", n_layers=int(cfg_m.n_layers), d_model=int(cfg_m.d_model),
            n_heads=int(cfg_m.n_heads), n_ctx=bench.setting.seq, batch_size=bench.setting.batch,
            vocab_size=int(cfg_m.d_vocab), tokenizer=_tokenizer_dir(bench.model_source),
            max_steps=10**6, warmup_steps=0, eval_windows=1)
        trainer = mod.Trainer(cfg, run_dir, device=bench.device)
        edited = list(trainer.hooks)
        if not edited:
            raise RuntimeError("the 'vpara' trainer has no edit hooks; nothing to compare")
        bench.extra["trainer_model"] = (f"seeded GPT-2 n_layers={cfg.n_layers} d_model="
                                        f"{cfg.d_model} n_ctx={cfg.n_ctx}, float32")
        bench.extra["edit_hooks"] = len(edited)

        def step(hooks):
            trainer.hooks = hooks
            return trainer.train_step(0)

        timing = bench.measure(lambda: step([]), lambda: step(edited))
        trainer.hooks = edited
        return timing
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@register(
    "compression_local_cost", target=2.0, op="<=", precision=0.10,
    baseline="one plain forward of the dense model on the batch (return_type=None)",
    candidate="compression_geometry(dense, compressed, batch, mode='local', verify=False): "
              "every layer and unit",
)
def compression_local_cost(bench: Bench):
    """The local (layer-at-a-time) compression-error geometry over every layer and unit / a
    plain forward of the dense model on the same batch."""
    geo = _require("tl_directional.compression", "compression_geometry")
    comp = _require("tl_directional.compression.compressors", "prune_magnitude")
    dense, batch = bench.model, bench.inputs
    # ADJUST HERE if the compression API changes.
    compressed = comp.prune_magnitude(dense, 0.5).model
    bench.extra["compressed_model"] = "prune_magnitude(dense, 0.5)"
    # what the ratio cannot go below: the matrix products alone (benchmarks/floors.py)
    bench.extra["matmul_floor"] = round(compression_local_floor(Shape.of(dense.cfg),
                                                                int(batch.tokens.shape[-1])), 4)

    def cand():
        return _call(geo.compression_geometry, dense, compressed, batch, mode="local",
                     batch_size=len(batch), verify=False, progress=False)

    if bench.check:
        table = cand()
        bench.extra["check_rows"] = len(table) if hasattr(table, "__len__") else None
        del table
    return bench.measure(lambda: forward(dense, batch, None), cand)


__all__ = ["SWEEP_K", "SWEEP_S_PAR", "compression_local_cost", "layer_sweep_shared_prefix", "sweep_cost",
           "train_step_overhead"]
