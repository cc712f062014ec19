"""Saved models: export a trained bridge-lane model as a plain Hugging Face directory, and score
a model on a text (loss and perplexity over windows as in training)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..edit import Edit, edit_hooks
from ..io.outputs import replace_dir
from ..model.handle import device_of
from ..model.lanes import quiet_transformers
from ..model.load import BUILD_INFO_FILE
from ..model.sites import lane_of
from .data import TokenizerMismatchError, encode_text, make_windows
from .model import canonical_state_dict


def export_model(model: Any, tokenizer: Any, path: str | os.PathLike[str], *,
                 dtype: torch.dtype = torch.float16, extra_info: dict[str, Any] | None = None,
                 force: bool = False, force_hint: str = "pass force=True") -> Path:
    """Save a bridge-lane model as a plain Hugging Face directory (safetensors + tokenizer).

    The directory loads with ``TransformerBridge.boot_transformers(path)``,
    ``transformers.GPT2LMHeadModel.from_pretrained(path)`` and, on the legacy lane,
    :func:`tl_directional.model.load.load_model`. Written to a temporary sibling with a
    ``manifest.json`` and swapped in (:func:`tl_directional.io.outputs.replace_dir`); a
    non-empty ``path`` that is not a previous export (e.g. the run directory itself) is
    refused unless ``force``, so no user file is ever deleted.
    """
    import transformers

    if not lane_of(model).hf_export:
        raise NotImplementedError(
            "export_model needs a bridge-lane model (TransformerLens >= 4): a legacy "
            "HookedTransformer keeps an untied unembedding and TL-format weights, which do not map "
            "back onto GPT-2's Hugging Face layout. Train on the bridge lane to export."
        )
    cfg_dict = model.original_model.config.to_dict()
    # The bridge switches on output_attentions / eager attention for its hooks; the exported
    # model is a plain GPT-2 again.
    for key in ("output_attentions", "output_hidden_states"):
        cfg_dict[key] = False
    for key in ("_attn_implementation", "attn_implementation", "_attn_implementation_internal"):
        cfg_dict.pop(key, None)
    hf_config = transformers.GPT2Config.from_dict(cfg_dict)
    state = canonical_state_dict(model)
    with torch.random.fork_rng(devices=[]):
        fresh = transformers.GPT2LMHeadModel(hf_config)
    fresh.load_state_dict(state, strict=True)
    fresh = fresh.to(dtype)
    out = Path(path)
    with replace_dir(path, "export", force=force, force_hint=force_hint, command="tl-directional train --export",
                     legacy_names=EXPORT_NAMES) as tmp:
        with quiet_transformers():
            fresh.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        _portable_tokenizer_config(tmp)
        info = {"family": "gpt2", "architecture": "GPT2LMHeadModel", "random_weights": False,
                **(extra_info or {})}
        (tmp / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
    return out


#: The files of an export written before exports carried a manifest (the bundled default model,
#: with the files studies/data/train_default_model.py adds beside it): recognised as a previous export.
EXPORT_NAMES = frozenset({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                           "tl_directional_build.json", "training_curve.csv", "reference_logits.json",
                           "report.json"})


def _portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class ``PreTrainedTokenizerFast``, which transformers 4.x and 5.x both
    know (transformers 5 writes ``TokenizersBackend``, which 4.x cannot load)."""
    cfg_path = path / "tokenizer_config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check_tokenizer_matches(model: Any, tokenizer: Any, where: str) -> None:
    """Raise :class:`TokenizerMismatchError` when ``tokenizer`` has ids the model cannot embed."""
    d_vocab = int(model.cfg.d_vocab)
    if len(tokenizer) > d_vocab:
        raise TokenizerMismatchError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model embeds only "
            f"{d_vocab}; they do not belong together. Save the model with its own tokenizer "
            "(export_model does) or pass the tokenizer it was trained with."
        )


@torch.no_grad()
def evaluate_text(model: Any, text: str, *, n_ctx: int | None = None, batch_size: int = 8,
                  edits: Sequence[Edit] = ()) -> dict[str, float]:
    """Mean next-token loss and perplexity of ``model`` on ``text`` (windows as in training)."""
    tok = model.tokenizer
    check_tokenizer_matches(model, tok, "evaluate_text")
    n_ctx = n_ctx or int(model.cfg.n_ctx)
    windows = make_windows(encode_text(tok, text), n_ctx, tok.bos_token_id)
    hooks = edit_hooks(model, *edits)
    total, count = 0.0, 0
    model.eval()
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size].to(device_of(model))
        with model.hooks(fwd_hooks=hooks):
            loss = model(chunk, return_type="loss")
        total += float(loss) * len(chunk)
        count += len(chunk)
    mean = total / max(count, 1)
    return {"loss": mean, "perplexity": math.exp(mean), "windows": count,
            "tokens_scored": count * (n_ctx - 1)}
