"""SAE features as references, and an SAE's reconstruction against its error term, split
against the live residual stream.

* :func:`sae_directions`: the decoder rows of chosen features as a
  :class:`~tl_directional.core.direction.Direction` (``[d_model]`` for one feature, the
  ``[k, d_model]`` subspace they span for several), with its provenance: hook point and layer
  from the SAE's cfg, where the SAE was read, the feature ids, and whether its model's weights
  were processed (TransformerLens issue #642: a direction from a processed model does not mean
  the same in an unprocessed one).
* :func:`sae_split`: for a batch of tokens, per token, the SAE's reconstruction ``x_hat`` and
  its error term ``e = x - x_hat`` at the SAE's hook point ``x`` (the residual stream there),
  each split against ``x`` (METHOD.md sec. 1: ``u_par = a x``, ``u_perp = u - u_par``). The
  forward pass of the SAE is computed from its weights (:mod:`~tl_directional.measure.sae_weights`)
  on every lane; on the legacy lane it equals SAELens's ``HookedSAETransformer``
  (``hook_sae_recons`` and, with ``use_error_term=True``, ``hook_sae_error``).

Since ``x_hat + e = x``, the two splits are tied: ``alpha(x_hat) + alpha(e) = 1`` and
``x_hat_perp = -e_perp``. The reconstruction's turning part is exactly what the error term
turns back; what the split tells is how much of the stream's own direction the SAE keeps
(``alpha(x_hat)``), and how large the turn between the stream and its reconstruction is
(``||e_perp|| / ||x||``), against a random update's energy share ``1 / d_model`` along ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.direction import Direction
from ..core.geometry import DEFAULT_EPS, check_eps, compute_dtype, decompose
from ..core.subspace import random_energy_share
from ..model.handle import capture_hooks, run_hooked
from ..model.inputs import prepare_inputs
from .sae_weights import SAEError, SAEWeights, load_sae_weights

#: Hook points whose activations live in the residual stream's space (``d_model``).
RESID_WIDTH_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")


def _check_model(sae: SAEWeights, model, argument: str) -> None:
    """Refuse an SAE whose width or layer does not fit ``model``."""
    d_model, n_layers = int(model.cfg.d_model), int(model.cfg.n_layers)
    if sae.d_in != d_model:
        raise SAEError(f"{argument} ({sae.source}) reads {sae.d_in}-wide activations but the model has "
                       f"d_model={d_model}; use an SAE trained on this model (hook {sae.hook_name!r})")
    if sae.layer is not None and not 0 <= sae.layer < n_layers:
        raise SAEError(f"{argument} ({sae.source}) was trained at {sae.hook_name!r}, layer {sae.layer}, "
                       f"but the model has layers 0..{n_layers - 1}; use an SAE trained on this model")


def _feature_ids(features, d_sae: int) -> list[int] | int | None:
    """``features`` as an int, a list of distinct ints in ``[0, d_sae)``, or None (all)."""
    if features is None:
        return None
    if isinstance(features, Tensor):
        if features.is_floating_point() or features.dtype == torch.bool or features.ndim > 1:
            raise SAEError(f"features must be an int, a list of ints or a 1-D integer tensor, got a "
                           f"{features.dtype} tensor of shape {tuple(features.shape)}")
        features = features.tolist()
    single = isinstance(features, int) and not isinstance(features, bool)
    ids = [features] if single else (list(features) if isinstance(features, Sequence) and not isinstance(features, str) else None)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SAEError(f"features must be None (all), a feature id or a non-empty list of feature ids "
                       f"(ints in [0, {d_sae})), got {features!r}")
    bad = [i for i in ids if not 0 <= i < d_sae]
    if bad:
        raise SAEError(f"features {bad} out of range: the SAE has d_sae={d_sae} features, ids "
                       f"0..{d_sae - 1}; pass ids in that range")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise SAEError(f"features repeats ids {dup}: a repeated decoder row spans nothing new; pass each once")
    return ids[0] if single else ids


def sae_directions(sae_or_path: object, features=None, *, model=None) -> Direction:
    """Decoder rows of an SAE as a :class:`~tl_directional.core.direction.Direction`.

    Args:
        sae_or_path: a SAELens ``SAE`` object (legacy lane), a folder SAELens saved
            (``cfg.json`` + ``sae_weights.safetensors``), that ``.safetensors`` file, an
            :class:`~tl_directional.measure.sae_weights.SAEWeights`, or ``"default"`` (the SAE
            bundled with the package, trained by SAELens on the default model's
            ``blocks.2.hook_resid_pre``). Files are read with ``safetensors``; SAELens is not needed.
        features: one feature id (-> ``vectors [d_model]``), a list of distinct ids (-> the
            ``[k, d_model]`` subspace their rows span), or None (every row, ``[d_sae, d_model]``;
            with ``d_sae >= d_model`` that usually spans the whole space).
        model: when given, the SAE's width and layer are checked against it.

    Returns:
        A ``Direction`` with ``source="sae_decoder"``, ``space="resid"``, the SAE's
        ``hook_name`` and ``layer``, ``weights_processed`` from its cfg (None: unknown) and
        ``details``: ``features``, ``sae`` (where it was read), ``architecture``, ``d_sae``,
        ``decoder_norms`` (the rows' norms; splits do not depend on them),
        ``model_name`` and ``model_from_pretrained_kwargs`` (as the cfg records them).

    Raises:
        FileNotFoundError: a path without the SAE's files.
        SAEError: (a ``ValueError``) feature ids out of range, repeated or not ints; an SAE
            that is not on a residual-width hook point; a width or layer that does not fit
            ``model``; unreadable files.
    """
    sae = load_sae_weights(sae_or_path, argument="sae_or_path")
    hook = sae.hook_name
    if hook is not None and not hook.endswith(RESID_WIDTH_HOOKS):
        raise SAEError(f"sae_or_path ({sae.source}) was trained at {hook!r}, not in the residual stream's "
                       f"space ({', '.join(RESID_WIDTH_HOOKS)}); its decoder rows are no residual direction")
    if model is not None:
        _check_model(sae, model, "sae_or_path")
    ids = _feature_ids(features, sae.d_sae)
    rows = sae.W_dec if ids is None else sae.W_dec[ids]
    meta = sae.cfg.get("metadata") if isinstance(sae.cfg.get("metadata"), dict) else sae.cfg
    details = {
        "features": list(range(sae.d_sae)) if ids is None else ids,
        "sae": sae.source,
        "architecture": sae.architecture,
        "d_sae": sae.d_sae,
        "decoder_norms": rows.norm(dim=-1).tolist() if rows.ndim == 2 else float(rows.norm()),
        "model_name": meta.get("model_name"),
        "model_from_pretrained_kwargs": meta.get("model_from_pretrained_kwargs"),
    }
    return Direction(vectors=rows.clone(), source="sae_decoder", space="resid", hook_name=hook,
                     layer=sae.layer, weights_processed=sae.weights_processed, details=details)


@dataclass(frozen=True)
class SAESplit:
    """An SAE's reconstruction and error term at its hook point, split against the stream there.

    All tensors are in the compute dtype (float64 stays float64, anything else float32).

    Attributes:
        hook_name: the hook point ``x`` was read at (the SAE's).
        layer: its layer.
        tokens: ``[batch, pos]`` token ids.
        mask: ``[batch, pos]`` True on real tokens (False on padding).
        first: ``[batch, pos]`` True on each row's first real token (BOS, the attention sink).
        stream: ``[batch, pos, d_model]`` the residual stream ``x`` at ``hook_name``.
        feature_acts: ``[batch, pos, d_sae]`` the SAE's feature activations.
        reconstruction: ``[batch, pos, d_model]`` ``x_hat`` (SAELens's ``hook_sae_recons``).
        error: ``[batch, pos, d_model]`` ``x - x_hat`` (SAELens's ``hook_sae_error``).
        recon_alpha: ``[batch, pos]`` ``(x_hat . x) / ||x||^2``.
        error_alpha: ``[batch, pos]`` ``(e . x) / ||x||^2`` (``= 1 - recon_alpha``).
        recon_par, recon_perp, error_par, error_perp: ``[batch, pos, d_model]`` the parts.
        recon_par_frac, error_par_frac: ``[batch, pos]`` ``|cos(u, x)|``.
        degenerate: ``[batch, pos]`` ``||x||^2 <= eps`` or the part's ``||u||^2 <= eps``
            (reconstruction or error), METHOD.md sec. 1.
    """

    hook_name: str
    layer: int | None
    tokens: Int[Tensor, "batch pos"]
    mask: Bool[Tensor, "batch pos"]
    first: Bool[Tensor, "batch pos"]
    stream: Float[Tensor, "batch pos d_model"]
    feature_acts: Float[Tensor, "batch pos d_sae"]
    reconstruction: Float[Tensor, "batch pos d_model"]
    error: Float[Tensor, "batch pos d_model"]
    recon_alpha: Float[Tensor, "batch pos"]
    error_alpha: Float[Tensor, "batch pos"]
    recon_par: Float[Tensor, "batch pos d_model"]
    recon_perp: Float[Tensor, "batch pos d_model"]
    error_par: Float[Tensor, "batch pos d_model"]
    error_perp: Float[Tensor, "batch pos d_model"]
    recon_par_frac: Float[Tensor, "batch pos"]
    error_par_frac: Float[Tensor, "batch pos"]
    degenerate: Bool[Tensor, "batch pos"]

    @property
    def d_model(self) -> int:
        """Width of the stream."""
        return int(self.stream.shape[-1])

    @property
    def random_energy_share(self) -> float:
        """``1 / d_model``: a random update's expected energy share along the stream."""
        return random_energy_share(1, self.d_model)

    def kept(self, include_first: bool = False) -> Bool[Tensor, "batch pos"]:
        """Tokens a summary counts: real, not degenerate, and (unless ``include_first``) not the
        first token of their row."""
        keep = self.mask & ~self.degenerate
        return keep if include_first else keep & ~self.first

    def explained_variance(self, include_first: bool = False) -> float:
        """``1 - sum ||e||^2 / sum ||x - mean(x)||^2`` over the :meth:`kept` tokens."""
        keep = self.kept(include_first)
        x, e = self.stream[keep], self.error[keep]
        total = ((x - x.mean(0)) ** 2).sum()
        return float(1 - (e * e).sum() / total) if total > 0 else float("nan")

    def summary(self, include_first: bool = False) -> pd.DataFrame:
        """One row per part (``reconstruction``, ``error``) over the :meth:`kept` tokens:
        ``energy_share`` (``sum ||u_par||^2 / sum ||u||^2``) beside ``random_energy_share``
        (``1 / d_model``), ``norm_share`` (``sum ||u||^2 / sum ||x||^2``), the median and
        quartiles of ``alpha`` and ``par_frac``, ``tokens`` and ``first_token``
        (``"excluded"`` or ``"included"``)."""
        keep = self.kept(include_first)
        x_sq = (self.stream[keep] ** 2).sum()
        rows = []
        for name, par, u, alpha, frac in (
                ("reconstruction", self.recon_par, self.reconstruction, self.recon_alpha, self.recon_par_frac),
                ("error", self.error_par, self.error, self.error_alpha, self.error_par_frac)):
            u_sq = (u[keep] ** 2).sum()
            q = torch.tensor([0.25, 0.5, 0.75], dtype=alpha.dtype)
            a_q = alpha[keep].quantile(q).tolist() if keep.any() else [float("nan")] * 3
            rows.append({
                "part": name, "tokens": int(keep.sum()),
                "energy_share": float((par[keep] ** 2).sum() / u_sq) if u_sq > 0 else float("nan"),
                "random_energy_share": self.random_energy_share,
                "norm_share": float(u_sq / x_sq) if x_sq > 0 else float("nan"),
                "alpha_q25": a_q[0], "alpha_median": a_q[1], "alpha_q75": a_q[2],
                "par_frac_median": float(frac[keep].median()) if keep.any() else float("nan"),
                "first_token": "included" if include_first else "excluded",
            })
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per real token: ``batch``, ``pos``, ``token``, ``first``, ``degenerate``,
        ``l0`` (active features), the norms of ``x``, ``x_hat`` and ``e``, and per part
        ``alpha`` / ``par_frac`` / ``perp_over_stream`` (``||u_perp|| / ||x||``)."""
        b, p = torch.nonzero(self.mask, as_tuple=True)
        x_norm = self.stream.norm(dim=-1)
        safe = torch.where(x_norm > 0, x_norm, torch.ones_like(x_norm))
        cols = {
            "batch": b, "pos": p, "token": self.tokens[b, p], "first": self.first[b, p],
            "degenerate": self.degenerate[b, p], "l0": (self.feature_acts[b, p] != 0).sum(-1),
            "stream_norm": x_norm[b, p], "recon_norm": self.reconstruction[b, p].norm(dim=-1),
            "error_norm": self.error[b, p].norm(dim=-1),
            "recon_alpha": self.recon_alpha[b, p], "recon_par_frac": self.recon_par_frac[b, p],
            "recon_perp_over_stream": (self.recon_perp.norm(dim=-1) / safe)[b, p],
            "error_alpha": self.error_alpha[b, p], "error_par_frac": self.error_par_frac[b, p],
            "error_perp_over_stream": (self.error_perp.norm(dim=-1) / safe)[b, p],
        }
        return pd.DataFrame({k: v.detach().cpu().numpy() for k, v in cols.items()})


def _first_real(mask: Tensor) -> Tensor:
    """``[batch, pos]`` True at each row's first real token (left padding included)."""
    idx = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(mask, idx, torch.full_like(idx, mask.shape[1])).min(dim=1, keepdim=True).values
    return mask & (idx == first)


def sae_split(model, inputs, sae_or_path: object = "default", *, attention_mask: Tensor | None = None,
              eps: float = DEFAULT_EPS) -> SAESplit:
    """An SAE's reconstruction and error term at its hook point, each split against the stream.

    One forward pass of ``model`` (stopped after the SAE's hook point) reads ``x`` at the SAE's
    ``hook_name``; the SAE's forward pass is computed from its weights in the compute dtype
    (``x_hat = decode(encode(x))``, ``e = x - x_hat``), and both are split against ``x`` per
    token (module docstring).

    Args:
        model: a TransformerLens model (TL 4 ``TransformerBridge`` or legacy
            ``HookedTransformer``) with the SAE's hook point and width.
        inputs: a string, a list of strings, token-id lists or a ``[batch, pos]`` LongTensor.
        sae_or_path: as in :func:`sae_directions` (default: the bundled SAE of the default model).
        attention_mask: ``[batch, pos]`` 1 on real tokens, for padded token ids.
        eps: degeneracy threshold on squared norms (METHOD.md sec. 1).

    Returns:
        An :class:`SAESplit` (tensors; ``summary()`` and ``to_frame()`` give DataFrames).

    Raises:
        SAEError: (a ``ValueError``) an SAE without a hook name, of the wrong width or layer for
            ``model``, or whose hook point the model lacks; the errors of :func:`sae_directions`.
        ValueError: a bad ``eps`` or ``inputs``.
    """
    eps = check_eps(eps)
    sae = load_sae_weights(sae_or_path, argument="sae_or_path")
    if sae.hook_name is None:
        raise SAEError(f"sae_or_path ({sae.source}) does not say which hook point it reads "
                       "(cfg metadata.hook_name); add it to its cfg.json")
    _check_model(sae, model, "sae_or_path")
    if sae.hook_name not in model.hook_dict:
        raise SAEError(f"sae_or_path ({sae.source}) reads {sae.hook_name!r}, which this model has "
                       "no hook point for; use an SAE trained on this model's architecture")
    batch = prepare_inputs(model, inputs, attention_mask, argument="inputs")
    store: dict[str, Tensor] = {}
    padded = bool((batch.attention_mask == 0).any())
    with torch.no_grad():
        run_hooked(model, batch.tokens, batch.attention_mask if padded else None,
                   capture_hooks([sae.hook_name], store), stop_at=sae.hook_name)
    x = store[sae.hook_name]
    x = x.to(compute_dtype(x.dtype))
    acts = sae.encode(x)
    recon = sae.decode(acts)
    error = x - recon
    r, e = decompose(recon, x, eps), decompose(error, x, eps)
    mask = batch.attention_mask.to(device=x.device).bool()
    return SAESplit(
        hook_name=sae.hook_name, layer=sae.layer, tokens=batch.tokens, mask=mask, first=_first_real(mask),
        stream=x, feature_acts=acts, reconstruction=recon, error=error,
        recon_alpha=r.alpha, error_alpha=e.alpha, recon_par=r.par, recon_perp=r.perp,
        error_par=e.par, error_perp=e.perp, recon_par_frac=r.par_frac, error_par_frac=e.par_frac,
        degenerate=r.degenerate | e.degenerate)


__all__ = ["RESID_WIDTH_HOOKS", "SAESplit", "sae_directions", "sae_split"]
