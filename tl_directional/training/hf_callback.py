"""Training with an edit active: a ``transformers.TrainerCallback`` and an ``s_par`` schedule.

:class:`DirectionalEditCallback` installs edits (:mod:`tl_directional.edit.hf.edits`) on the
Trainer's model when training begins and removes them when it ends; the forward passes of
training, and of evaluation unless ``during_eval=False``, run edited, and gradients flow through
the edit (METHOD.md sec. 7). With a :class:`SparSchedule` the edits' ``s_par`` follows the
optimizer step (constant, or a linear warm-up from ``start`` to ``end``). Every ``log_every``
steps the callback measures, on that step's training batch, the parallel energy share of every
edited site per layer (``sum ||y_par||^2 / sum ||y||^2``, against the site's reference, first
position excluded) and writes it into the Trainer's own logs and ``state.log_history`` as
``tld/<edit space>/L<layer>``, with the current ``tld/s_par``. The schedule depends only on
``state.global_step``, so a run resumed from a Trainer checkpoint continues the same curve.

For a plain PyTorch loop use :func:`tl_directional.edit.hf.install_edits` directly (docs/hf_training.md).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import TrainerCallback

from ..edit import DiagonalRemoval, Edit
from ..edit.hf.edits import EditsAlreadyInstalledError, HFEditHandle, install_edits, installed_edits

#: The range an ``s_par`` schedule must stay in: 0 removes the parallel part, 1 is the unedited
#: model, values up to 10 amplify it (beyond that a float16/bfloat16 run overflows quickly).
S_PAR_RANGE = (0.0, 10.0)


def _check_value(name: str, value) -> float:
    lo, hi = S_PAR_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"SparSchedule {name} must be a finite number in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(
            f"SparSchedule {name}={value!r} leaves the valid s_par range [{lo}, {hi}] (0 removes the "
            f"parallel part, 1 leaves it unchanged); pick {name} inside it")
    return float(value)


@dataclass(frozen=True)
class SparSchedule:
    """``s_par`` as a function of the optimizer step: ``start`` at step 0, linearly to ``end``
    at ``warmup_steps``, then ``end``. ``SparSchedule.constant(s)`` keeps ``s`` throughout.

    Both ends must lie in :data:`S_PAR_RANGE` (so every value in between does); ``warmup_steps``
    is an int >= 0 (0: ``end`` from the first step). Out-of-range arguments raise a ValueError
    naming the argument, the value and the range.
    """

    start: float = 1.0
    end: float = 0.0
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _check_value("start", self.start))
        object.__setattr__(self, "end", _check_value("end", self.end))
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"SparSchedule warmup_steps must be an int >= 0, got {w!r}")

    @classmethod
    def constant(cls, s_par: float) -> SparSchedule:
        """``s_par`` at every step."""
        return cls(start=s_par, end=s_par, warmup_steps=0)

    def __call__(self, step: int) -> float:
        """``s_par`` at optimizer step ``step`` (0-based, ``state.global_step`` before the step)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if self.warmup_steps == 0 or step >= self.warmup_steps:
            return self.end
        return self.start + (self.end - self.start) * step / self.warmup_steps


class DirectionalEditCallback(TrainerCallback):
    """Keep tl_directional edits active on a ``transformers.Trainer``'s model while it trains.

    Args:
        edits: one edit or a sequence (``ValueScale``, ``ResidualScale``, ``EffectiveDiagonal``,
            ``DiagonalRemoval``), installed together (:func:`~tl_directional.edit.hf.install_edits`).
        schedule: optional :class:`SparSchedule`; at every optimizer step each edit's ``s_par``
            is set to ``schedule(state.global_step)`` (``DiagonalRemoval`` has no scale: refused).
        during_eval: False keeps the edits off whenever the model is in eval mode (the Trainer's
            evaluation and prediction loops); True (default) edits evaluation too.
        log_every: measure and log the parallel share per edited site and layer every this many
            optimizer steps (None: never). Measuring reads the training batch of that step only.

    Example::

        cb = DirectionalEditCallback(ValueScale(0.0), schedule=SparSchedule(1.0, 0.0, 100), log_every=50)
        Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    """

    def __init__(self, edits: Edit | Sequence[Edit], *, schedule: SparSchedule | None = None,
                 during_eval: bool = True, log_every: int | None = None):
        self.edits = (edits,) if isinstance(edits, Edit) else tuple(edits)
        if not self.edits:
            raise ValueError("edits is empty; pass at least one edit, e.g. ValueScale(0.0)")
        for i, e in enumerate(self.edits):
            if not isinstance(e, Edit):
                raise TypeError(f"edits[{i}] is a {type(e).__name__}, not a tl_directional edit")
            if schedule is not None and isinstance(e, DiagonalRemoval):
                raise ValueError(f"schedule sets s_par, but edits[{i}] is {e!r}, which has no scale; "
                                 "drop the schedule or use EffectiveDiagonal / ValueScale")
        if schedule is not None and not isinstance(schedule, SparSchedule):
            raise TypeError(f"schedule must be a SparSchedule (or None), got {type(schedule).__name__}")
        if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, int)
                                      or log_every < 1):
            raise ValueError(f"log_every must be an int >= 1 (steps) or None, got {log_every!r}")
        self.schedule = schedule
        self.during_eval = bool(during_eval)
        self.log_every = log_every
        self.handle: HFEditHandle | None = None
        self._model = None
        self._s_par: float | None = None
        self._pending: dict[str, float] = {}
        self._measuring = False

    # -- installation --------------------------------------------------------------------------

    def _edits_at(self, s_par: float | None) -> tuple[Edit, ...]:
        if s_par is None:
            return self.edits
        out = []
        for e in self.edits:
            c = copy.copy(e)
            c.s_par = s_par
            out.append(c)
        return tuple(out)

    def _install(self, model, s_par: float | None) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        model_ = model
        when = None if self.during_eval else (lambda: model_.training)
        self.handle = install_edits(model, *self._edits_at(s_par), when=when)
        self._s_par = s_par

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("DirectionalEditCallback needs the Trainer's model (on_train_begin got model=None)")
        current = installed_edits(model)
        if current is not None and current is not self.handle:
            raise EditsAlreadyInstalledError(
                f"{type(model).__name__} already has tl_directional edits installed ({list(current.edits)}); "
                "the callback installs its own: remove them first (handle.remove() or "
                "tl_directional.edit.hf.remove_edits(model)), or pass those edits to the callback instead")
        self._model = model
        s = None if self.schedule is None else self.schedule(state.global_step)
        self._install(model, s)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._model is None:
            return
        if self.schedule is not None:
            s = self.schedule(state.global_step)
            if s != self._s_par:
                self._install(self._model, s)
        if self.log_every is not None and (state.global_step + 1) % self.log_every == 0:
            self.handle.start_measuring()
            self._measuring = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._measuring:
            self._pending = self.handle.stop_measuring()
            self._measuring = False
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._pending:
            return
        extra = {f"tld/{k}": v for k, v in self._pending.items()}
        if self._s_par is not None:
            extra["tld/s_par"] = self._s_par
        self._pending = {}
        if logs is not None:
            logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)

    def on_train_end(self, args, state, control, **kwargs):
        self.remove()

    def remove(self) -> None:
        """Take the callback's edits off the model (the Trainer does this at the end of training;
        after an exception inside ``trainer.train()`` call it yourself, or use ``with callback:``)."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        self._model = None
        self._measuring = False

    def __enter__(self) -> DirectionalEditCallback:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


__all__ = ["DirectionalEditCallback", "S_PAR_RANGE", "SparSchedule"]
