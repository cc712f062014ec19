"""The trained model: a seeded GPT-2 initialisation written as a Hugging Face directory, its
weights under their native names (what checkpoints hold), and its trainable parameters."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..io.model_files import check_model_dir
from ..io.records import write_manifest
from ..model.lanes import lane_of, quiet_transformers
from ..model.load import ENDOFTEXT, hf_config, load_model
from .checkpoint import CheckpointError
from .config import TrainConfig


def _gpt2_init_(model: torch.nn.Module, seed: int, n_layers: int) -> None:
    """GPT-2 style init, seeded per parameter name: N(0, 0.02) for matrices (output projections
    scaled by 1/sqrt(2 n_layers)), zero biases, unit LayerNorm gains."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("c_proj.weight") else 0.02
                p.copy_(std * torch.randn(p.shape, generator=gen))


def build_init_dir(cfg: TrainConfig, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """Write the seeded, untrained GPT-2 of ``cfg`` (+ tokenizer) as a Hugging Face directory."""
    import transformers

    out = Path(path)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    special = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = hf_config("gpt2", n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
                        n_kv_heads=cfg.n_heads, d_mlp=cfg.d_mlp or 4 * cfg.d_model,
                        n_ctx=cfg.n_ctx, vocab_size=cfg.vocab_size, special_id=special)
    with torch.random.fork_rng(devices=[]):
        model = transformers.GPT2LMHeadModel(config)
    _gpt2_init_(model, cfg.seed, cfg.n_layers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700
    try:
        with quiet_transformers():
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, "init")
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_init(init: Path, device: torch.device) -> Any:
    """Load the run's seeded initial model, verified first: a damaged file is a
    :class:`CheckpointError` naming it (the directory can always be rebuilt from the seed)."""
    fix = f"the init directory is made from the seed: delete {init} and run again to rebuild it"
    try:
        check_model_dir(init, "init")
        return load_model(init, device=device)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors / transformers raise their own types
        raise CheckpointError(f"{init} cannot be loaded ({err}); {fix}") from None


def canonical_state_dict(model: Any) -> dict[str, Tensor]:
    """The model's weights under their native names, as contiguous detached copies.

    Bridge lane: the wrapped Hugging Face model's own keys (``transformer.h.0.attn.c_attn.weight``
    ...), i.e. exactly what ``save_pretrained`` of an unwrapped model holds. Legacy lane: the
    ``HookedTransformer`` state dict (``blocks.0.attn.W_Q`` ...).
    """
    lane = lane_of(model)
    if lane.hf_export:  # a wrapped HF model: its native names are the HF ones
        hf = model.original_model
        wanted = _hf_reference_keys(hf.config)
        sd = lane.native_state_dict(model)
        missing = [k for k in wanted if k not in sd]
        if missing:
            raise RuntimeError(f"cannot map bridge weights back to Hugging Face names: {missing[:5]}")
        return {k: sd[k].detach().clone().contiguous() for k in wanted}
    return {k: v.detach().clone().contiguous() for k, v in lane.native_state_dict(model).items()
            if torch.is_floating_point(v) and not k.endswith((".IGNORE", ".mask"))}


def _hf_reference_keys(hf_config: Any) -> list[str]:
    import transformers

    with torch.device("meta"):
        ref = transformers.GPT2LMHeadModel(hf_config)
    return list(ref.state_dict().keys())


def load_canonical_state_dict_(model: Any, state: dict[str, Tensor], *, source: str) -> None:
    """Copy ``state`` (from :func:`canonical_state_dict`) into ``model``'s parameters in place."""
    live = lane_of(model).native_state_dict(model, keep_vars=True)
    missing = [k for k in state if k not in live]
    if missing:
        raise CheckpointError(f"{source}: tensors {missing[:5]} do not exist in this model; the "
                              "checkpoint belongs to a different architecture or lane.")
    with torch.no_grad():
        for k, v in state.items():
            if tuple(live[k].shape) != tuple(v.shape):
                raise CheckpointError(f"{source}: {k} has shape {tuple(v.shape)} but the model "
                                      f"expects {tuple(live[k].shape)}.")
            live[k].copy_(v)


def trainable_parameters(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters that get gradients, each storage once.

    On a GPT-2 bridge the fused ``c_attn`` weight is also exposed as three views (q, k, v); the
    forward pass uses the views, so the fused base never receives a gradient. It is frozen
    (``requires_grad=False``) here, which ``DistributedDataParallel`` needs (every trainable
    parameter must receive a gradient); its storage still changes through the views.
    """
    params = list(model.named_parameters())
    by_storage: dict[int, list[tuple[str, torch.nn.Parameter]]] = {}
    for name, p in params:
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append((name, p))
    for group in by_storage.values():
        if len(group) < 2:
            continue
        for _name, p in group:
            others = sum(q.numel() for _, q in group if q is not p)
            if p.numel() == others:
                p.requires_grad_(False)
    return [(n, p) for n, p in params if p.requires_grad]
