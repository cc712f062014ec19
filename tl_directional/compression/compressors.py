"""Compressors: real weight compression of a copy of a TransformerLens model.

Every compressor takes a dense model, copies it (the dense model is never
touched), rewrites the weights of the attention and MLP linears of the copy, and
returns a :class:`CompressionResult` ``(model, record)``. Weights are written back
*dequantized* / *masked* / *reconstructed* in the model's own dtype, so hooks and
every analysis run on the compressed model unchanged.

All methods work on ``[out, in]`` matrices, whatever the storage layout: one
small adapter (:func:`linear_weights`) yields each linear weight as an
``[out, in]`` float copy plus a setter that writes it back in place (GPT-2's
``Conv1D`` stores ``[in, out]``; legacy TL stores ``W_Q [head, d_model, d_head]``,
``W_O [head, d_head, d_model]``, ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``).
So "per output channel" always means a row of ``[out, in]``, groups and N:M
blocks always run along the input axis. Embeddings, the (tied) unembedding,
norms and biases are left untouched.

Methods:

- :func:`quantize_rtn`: round-to-nearest weight quantization, symmetric or
  asymmetric, per output channel or in groups of ``group_size`` input channels.
- :func:`quantize_awq`: AWQ-style activation-aware scaling before RTN: per input
  channel scales ``s = mean|x|^a`` (``a`` searched per linear on calibration
  activations), ``W' = Q(W diag(s)) diag(s)^-1``.
- :func:`prune_magnitude`: unstructured magnitude pruning (per weight matrix).
- :func:`prune_wanda`: Wanda score ``|W_ij| * ||x_j||_2`` compared within each
  output row: unstructured at a sparsity, or N:M (keep N of every M inputs).
- :func:`low_rank`: truncated SVD of each linear at a rank fraction.
- :func:`drop_layers`: a block's update skipped (its attention and MLP output
  weights and biases zeroed, so the block adds exactly 0).
- :func:`compress`: any of the above from a spec string (``"rtn:bits=4,group=128"``).

:func:`save_compressed` writes a compressed bridge-lane model as a Hugging Face
directory (weights + tokenizer + a record JSON) for ``tl-directional compress-check``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..model.handle import clone_model, device_of, is_encoder
from ..model.indices import normalize_layers
from ..model.inputs import iter_batches, prepare_inputs
from ..model.sites import lane_of
from ..model.weights import linear_input_hooks
from .methods import (  # the per-matrix math
    _check_bits,
    _check_group,
    _check_nm,
    _check_sparsity,
    awq_matrix,
    low_rank_matrix,
    magnitude_mask,
    nm_mask,
    rtn_matrix,
    wanda_score,
)
from .specs import REGISTERED_METHODS, parse_spec

UNITS = ("attn", "mlp")
RECORD_FILE = "tl_directional_compression.json"


# ---------------------------------------------------------------------------------------------
# Records and results
# ---------------------------------------------------------------------------------------------


@dataclass
class CompressionRecord:
    """What a compressor did, for reports.

    ``params`` holds the method's settings (bits / group_size / symmetric, sparsity /
    pattern, rank_fraction, ...); ``weights`` lists every linear rewritten
    (``"blocks.3.attn.q"``); ``stats`` holds measured results (achieved sparsity,
    mean relative weight error).
    """

    method: str
    params: dict[str, Any]
    layers: list[int]
    weights: list[str]
    lane: str
    stats: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Short human label, e.g. ``"rtn w4 g128 asym"`` or ``"wanda 2:4"``."""
        p = self.params
        if self.method in ("rtn", "awq"):
            g = f"g{p['group_size']}" if p.get("group_size") else "per-ch"
            return f"{self.method} w{p['bits']} {g} {'sym' if p.get('symmetric') else 'asym'}"
        if self.method in ("magnitude", "wanda"):
            if p.get("n_m"):
                n, m = p["n_m"]
                return f"{self.method} {n}:{m}"
            return f"{self.method} {p['sparsity']:.0%}"
        if self.method == "low_rank":
            return f"svd rank {p['rank_fraction']:.0%}"
        if self.method == "drop":
            return "drop " + ",".join(str(x) for x in self.layers)
        if self.method == "identity":
            return "identity"
        return self.method

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.label
        return d


class CompressionResult(NamedTuple):
    """``(model, record)``; unpack it or use ``.model`` / ``.record``."""

    model: Any
    record: CompressionRecord


# ---------------------------------------------------------------------------------------------
# Copying a model
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The [out, in] adapter
# ---------------------------------------------------------------------------------------------


@dataclass
class LinearWeight:
    """One attention / MLP linear of a model, seen as an ``[out, in]`` matrix."""

    layer: int
    key: str  # "attn.q", "attn.o", "mlp.in", ...
    shape: tuple[int, int]  # (out, in)
    get: Callable[[], Tensor]  # float32 (float64 stays) copy, [out, in]
    set: Callable[[Tensor], None]  # write an [out, in] matrix back in place

    @property
    def unit(self) -> str:
        return self.key.split(".")[0]

    @property
    def name(self) -> str:
        return f"blocks.{self.layer}.{self.key}"


def linear_weights(model, *, layers=None, units: Sequence[str] = UNITS, keys: Iterable[str] | None = None) -> list[LinearWeight]:
    """The attention / MLP linears of ``model`` as ``[out, in]`` views with setters.

    Args:
        layers: None (all), an int or a sequence of ints.
        units: any of ``"attn"``, ``"mlp"``.
        keys: restrict to these keys (``"attn.q"``, ``"mlp.out"``, ...).
    """
    units = (units,) if isinstance(units, str) else tuple(units)
    bad = [u for u in units if u not in UNITS]
    if bad or not units:
        raise ValueError(f"units must be a non-empty subset of {UNITS}, got {units!r}")
    layers = normalize_layers(layers, int(model.cfg.n_layers))
    lane = lane_of(model)

    def fn(model, L):  # the lane knows the storage layout; here every linear is [out, in]
        return [LinearWeight(L, key, shape, get, set_) for key, shape, get, set_ in lane.linear_weights(model, L)]

    keys = None if keys is None else set(keys)
    out = []
    for L in layers:
        for lw in fn(model, L):
            if lw.unit in units and (keys is None or lw.key in keys):
                out.append(lw)
    if keys is not None:
        found = {lw.key for lw in out}
        if not found:
            raise ValueError(f"keys {sorted(keys)} match no linear; available: "
                             f"{sorted({lw.key for L in layers for lw in fn(model, L)})}")
    return out


# ---------------------------------------------------------------------------------------------
# Calibration statistics
# ---------------------------------------------------------------------------------------------


@dataclass
class InputStats:
    """Per-linear input statistics from calibration text.

    ``rms[name]``: ``[in]`` root mean square of each input channel over calibration
    tokens (``||x_j||_2 / sqrt(n_tokens)``; the constant factor does not change any
    per-row comparison); ``mean_abs[name]``: ``[in]`` mean ``|x_j|``; ``samples[name]``:
    up to ``n_samples`` input rows ``[n, in]`` (only when asked for).
    """

    rms: dict[str, Tensor]
    mean_abs: dict[str, Tensor]
    samples: dict[str, Tensor]
    n_tokens: int


@torch.no_grad()
def collect_input_stats(model, calibration, *, layers=None, batch_size: int = 8, n_samples: int = 0,
                        seed: int = 0) -> InputStats:
    """Stream ``calibration`` through ``model`` and collect the input statistics of every linear.

    ``calibration`` is anything :func:`tl_directional.prepare_inputs` accepts (strings,
    token lists, a ``[batch, pos]`` tensor, a :class:`TokenBatch`). Padding is excluded.
    """
    batch = prepare_inputs(model, calibration, argument="calibration")
    layers = normalize_layers(layers, int(model.cfg.n_layers))
    device = device_of(model)
    by_hook: dict[str, list] = {}
    for L in layers:
        for key, li in linear_input_hooks(model, L).items():
            by_hook.setdefault(li.hook, []).append((f"blocks.{L}.{key}", li.scale))
    sumsq: dict[str, Tensor] = {}
    sumabs: dict[str, Tensor] = {}
    count: dict[str, float] = {}
    reservoir: dict[str, list[Tensor]] = {}
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}

    def make(hook_name):
        targets = by_hook[hook_name]

        def hook(t, hook):  # noqa: ARG001
            mask = state["mask"]
            x = t.reshape(*t.shape[:2], -1) if t.ndim == 4 else t
            x = x[mask].double()
            for name, scale in targets:
                xs = x * scale.double() if scale is not None else x
                if name not in sumsq:
                    sumsq[name] = torch.zeros(xs.shape[-1], dtype=torch.float64, device=xs.device)
                    sumabs[name] = torch.zeros_like(sumsq[name])
                    count[name] = 0.0
                sumsq[name] += (xs * xs).sum(0)
                sumabs[name] += xs.abs().sum(0)
                count[name] += xs.shape[0]
                if n_samples:
                    k = min(xs.shape[0], n_samples)
                    idx = torch.randperm(xs.shape[0], generator=gen)[:k].to(xs.device)
                    reservoir.setdefault(name, []).append(xs[idx].float().cpu())
            return t

        return hook

    hooks = [(h, make(h)) for h in by_hook]
    n_tokens = 0
    with model.hooks(fwd_hooks=hooks):
        for part in iter_batches(batch, batch_size):
            part = part.to(device)
            state["mask"] = part.attention_mask.bool()
            model(part.tokens, attention_mask=part.attention_mask, return_type=None)
            n_tokens += int(part.attention_mask.sum())
    rms = {k: (sumsq[k] / max(count[k], 1.0)).sqrt().float() for k in sumsq}
    mean_abs = {k: (sumabs[k] / max(count[k], 1.0)).float() for k in sumabs}
    samples = {}
    for k, parts in reservoir.items():
        allx = torch.cat(parts)
        if allx.shape[0] > n_samples:
            allx = allx[torch.randperm(allx.shape[0], generator=gen)[:n_samples]]
        samples[k] = allx
    return InputStats(rms=rms, mean_abs=mean_abs, samples=samples, n_tokens=n_tokens)


# ---------------------------------------------------------------------------------------------
# Model-level compressors
# ---------------------------------------------------------------------------------------------


def _apply(model, method: str, params: dict, transform: Callable[[LinearWeight, Tensor], Tensor], *,
           layers, units, keys, inplace: bool = False) -> CompressionResult:
    target = model if inplace else clone_model(model)
    lws = linear_weights(target, layers=layers, units=units, keys=keys)
    rel_err = []
    zeros = total = 0
    for lw in lws:
        w = lw.get()
        new = transform(lw, w)
        lw.set(new)
        denom = float(w.norm())
        rel_err.append(float((new - w).norm()) / denom if denom > 0 else 0.0)
        zeros += int((new == 0).sum())
        total += new.numel()
    record = CompressionRecord(
        method=method,
        params=params,
        layers=sorted({lw.layer for lw in lws}),
        weights=[lw.name for lw in lws],
        lane=lane_of(model).name,
        stats={"weight_rel_error_mean": float(sum(rel_err) / max(len(rel_err), 1)),
               "zero_fraction": zeros / max(total, 1), "n_weights": float(total)},
    )
    return CompressionResult(target, record)


def quantize_rtn(model, bits: Any = 4, *, group_size: Any = None, symmetric: bool = True,
                 layers=None, units: Sequence[str] = UNITS, keys=None) -> CompressionResult:
    """Round-to-nearest weight quantization (dequantized back into a copy of ``model``).

    Args:
        bits: 2..8 (8/4/3 are the usual settings).
        group_size: None = one scale per output channel; else per group of this many
            consecutive input channels (32 / 64 / 128 are usual).
        symmetric: symmetric (no zero point) or asymmetric (integer zero point).
        layers, units, keys: scope (default: every attention and MLP linear).
    """
    _check_bits(bits)
    _check_group(group_size)
    params = {"bits": bits, "group_size": group_size, "symmetric": bool(symmetric)}
    return _apply(model, "rtn", params, lambda lw, w: rtn_matrix(w, bits, group_size, symmetric),
                  layers=layers, units=units, keys=keys)


def quantize_awq(model, calibration, bits: Any = 4, *, group_size: Any = 128, symmetric: bool = False,
                 alphas: Sequence[float] = tuple(i / 10 for i in range(11)), n_samples: int = 512,
                 batch_size: int = 8, layers=None, units: Sequence[str] = UNITS, keys=None,
                 stats: InputStats | None = None) -> CompressionResult:
    """AWQ-style activation-aware quantization (calibration-aware RTN).

    For each linear, input-channel scales ``s = mean|x|^a / sqrt(max * min)`` are applied
    before quantization and undone after (``W' = Q(W diag(s)) diag(s)^-1``, which equals
    folding ``1/s`` into the previous operation), with ``a`` chosen from ``alphas`` to
    minimise the output error ``||X W'^T - X W^T||`` on up to ``n_samples`` calibration
    tokens. ``a = 0`` is plain RTN, so the search never does worse than RTN on the
    calibration sample. (AWQ's weight-clipping search is not implemented.)
    """
    _check_bits(bits)
    _check_group(group_size)
    if stats is None or not stats.samples:
        stats = collect_input_stats(model, calibration, layers=layers, batch_size=batch_size, n_samples=n_samples)
    chosen: dict[str, float] = {}

    def transform(lw: LinearWeight, w: Tensor) -> Tensor:
        best, chosen[lw.name] = awq_matrix(w, stats.samples[lw.name], stats.mean_abs[lw.name], bits,
                                           group_size, symmetric, alphas)
        return best

    params = {"bits": bits, "group_size": group_size, "symmetric": bool(symmetric),
              "alphas": list(alphas), "n_samples": n_samples}
    res = _apply(model, "awq", params, transform, layers=layers, units=units, keys=keys)
    res.record.stats["alpha_mean"] = float(sum(chosen.values()) / max(len(chosen), 1))
    res.record.notes.append("chosen alpha per weight: " + json.dumps(chosen))
    return res


def prune_magnitude(model, sparsity: Any = 0.5, *, n_m: Any = None, per_row: bool = False,
                    layers=None, units: Sequence[str] = UNITS, keys=None) -> CompressionResult:
    """Magnitude pruning: zero the ``sparsity`` fraction of smallest ``|W|`` in each weight
    matrix (``per_row=True``: in each output row), or keep the ``N`` largest of every
    ``M`` consecutive inputs (``n_m=(N, M)``)."""
    if n_m is not None:
        n, m = _check_nm(n_m)
        params = {"sparsity": 1 - n / m, "n_m": [n, m], "score": "magnitude"}
        return _apply(model, "magnitude", params, lambda lw, w: w * nm_mask(w.abs(), n, m),
                      layers=layers, units=units, keys=keys)
    sparsity = _check_sparsity(sparsity)
    params = {"sparsity": sparsity, "n_m": None, "per_row": per_row, "score": "magnitude"}
    return _apply(model, "magnitude", params,
                  lambda lw, w: w * magnitude_mask(w.abs(), sparsity, per_row=per_row),
                  layers=layers, units=units, keys=keys)


def prune_wanda(model, calibration, sparsity: Any = 0.5, *, n_m: Any = None,
                batch_size: int = 8, layers=None, units: Sequence[str] = UNITS, keys=None,
                stats: InputStats | None = None) -> CompressionResult:
    """Wanda pruning (activation-aware): score ``|W_ij| * ||x_j||_2`` with input norms from
    ``calibration``, compared within each output row. Unstructured at ``sparsity``, or
    N:M (``n_m=(2, 4)``: keep the 2 highest-scoring of every 4 consecutive inputs)."""
    if n_m is not None:
        n, m = _check_nm(n_m)
        params = {"sparsity": 1 - n / m, "n_m": [n, m], "score": "wanda"}
    else:
        sparsity = _check_sparsity(sparsity)
        params = {"sparsity": sparsity, "n_m": None, "score": "wanda"}
    if stats is None:
        stats = collect_input_stats(model, calibration, layers=layers, batch_size=batch_size)

    def transform(lw: LinearWeight, w: Tensor) -> Tensor:
        score = wanda_score(w, stats.rms[lw.name])
        mask = nm_mask(score, n, m) if n_m is not None else magnitude_mask(score, sparsity, per_row=True)
        return w * mask

    res = _apply(model, "wanda", params, transform, layers=layers, units=units, keys=keys)
    res.record.stats["calibration_tokens"] = float(stats.n_tokens)
    return res


def low_rank(model, rank_fraction: Any = 0.5, *, layers=None, units: Sequence[str] = UNITS,
             keys=None) -> CompressionResult:
    """Replace each linear weight by its truncated SVD keeping ``rank_fraction`` of the
    full rank ``min(out, in)`` (at least rank 1)."""
    if isinstance(rank_fraction, bool) or not isinstance(rank_fraction, (int, float)) or not 0 < rank_fraction <= 1:
        raise ValueError(f"rank_fraction must be in (0, 1], got {rank_fraction!r}")
    ranks: dict[str, int] = {}

    def transform(lw, w):
        new, k = low_rank_matrix(w, float(rank_fraction))
        ranks[lw.name] = k
        return new

    res = _apply(model, "low_rank", {"rank_fraction": float(rank_fraction)}, transform,
                 layers=layers, units=units, keys=keys)
    res.record.stats["rank_mean"] = float(sum(ranks.values()) / max(len(ranks), 1))
    return res


def drop_layers(model, layers) -> CompressionResult:
    """Skip the update of whole blocks: their attention output and MLP output weights and
    biases are zeroed, so each dropped block adds exactly 0 to the stream (``e = -u``:
    purely parallel by construction). Not defined for post-LN models, where a block with a
    zero update still renormalises the stream."""
    if is_encoder(model):
        raise ValueError("layer drop is not defined for post-LN models (BERT): a zero update is "
                         "still followed by a LayerNorm, so the block is not skipped")
    if layers is None:
        raise ValueError("drop_layers needs the layers to drop (an int or a list of ints)")
    layers = normalize_layers(layers, int(model.cfg.n_layers))
    target = clone_model(model)
    names = []
    for lw in linear_weights(target, layers=layers, keys=("attn.o", "mlp.out")):
        lw.set(torch.zeros(lw.shape))
        names.append(lw.name)
    with torch.no_grad():
        for L in layers:
            for b in _output_biases(target, L):
                b.zero_()
    record = CompressionRecord("drop", {"layers": layers}, layers, names, lane_of(model).name,
                               stats={"by_construction_parallel": 1.0},
                               notes=["block update is exactly 0: error e = -u is purely parallel"])
    return CompressionResult(target, record)


def _output_biases(model, layer: int) -> list[Tensor]:
    return lane_of(model).output_biases(model, layer)


def identity(model) -> CompressionResult:
    """A plain copy (the no-op "compression"), for controls: its error is exactly zero."""
    target = clone_model(model)
    return CompressionResult(target, CompressionRecord("identity", {}, [], [], lane_of(model).name))


# ---------------------------------------------------------------------------------------------
# Spec strings
# ---------------------------------------------------------------------------------------------

def compress(model, spec: str, *, calibration=None, stats: InputStats | None = None, **overrides) -> CompressionResult:
    """Compress a copy of ``model`` as described by a spec string (see :data:`SPEC_HELP`).

    ``calibration`` (text or tokens) is required by ``wanda`` and ``awq``.
    """
    method, kw = parse_spec(spec)
    kw.update(overrides)
    if method in ("wanda", "awq") and calibration is None and stats is None:
        raise ValueError(f"{method} needs calibration text (calibration=...)")
    if method in REGISTERED_METHODS:
        return REGISTERED_METHODS[method](model, calibration=calibration, **kw)
    if method == "rtn":
        return quantize_rtn(model, **kw)
    if method == "awq":
        return quantize_awq(model, calibration, stats=stats, **kw)
    if method == "magnitude":
        return prune_magnitude(model, **kw)
    if method == "wanda":
        if "n_m" in kw:
            kw.setdefault("sparsity", None)
        return prune_wanda(model, calibration, stats=stats, **kw)
    if method == "low_rank":
        return low_rank(model, **kw)
    if method == "drop":
        return drop_layers(model, kw.get("layers"))
    return identity(model)


__all__ = [
    "CompressionRecord",
    "CompressionResult",
    "InputStats",
    "LinearWeight",
    "collect_input_stats",
    "compress",
    "drop_layers",
    "identity",
    "linear_weights",
    "low_rank",
    "prune_magnitude",
    "prune_wanda",
    "quantize_awq",
    "quantize_rtn",
]
