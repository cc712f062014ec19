"""Making ``model.generate`` give the tokens a plain forward pass would (both lanes).

Two upstream behaviours make TransformerLens generation disagree with a manual
greedy (argmax) loop over ``model(tokens)``:

* TL 2.18 (``HookedTransformer.generate``) builds each step's attention mask
  from a tensor of zeros compared with ``tokenizer.pad_token_id``. When the pad
  id is 0 (the bundled model and every :func:`~tl_directional.models.train_tokenizer`
  tokenizer: one special token, id 0, for BOS, EOS and PAD) every position looks
  like padding and all positional embeddings collapse to position 0. The fix
  here hands ``generate`` a view of the tokenizer whose ``pad_token_id`` is -1
  (no token has it) for the duration of the call; tokenisation and decoding
  still use the real tokenizer.
* TL 4 bridges (``TransformerBridge.generate``) give wrong logits with the KV
  cache for some architectures (GPT-2 and Llama shapes on TL 4.3). Here
  ``use_past_kv_cache`` defaults to False on the bridge; passing True first
  checks, once per model, that one cached step reproduces the full forward
  pass, and raises a ``ValueError`` naming the fix when it does not.

:func:`fix_generate` installs this on one model instance (idempotent);
:func:`~tl_directional.models.load_model` and :func:`~tl_directional.edit.apply_edits`
call it.
"""

from __future__ import annotations

import functools

import torch

_MARK = "_tld_generate_fixed"


class _NoPadTokenizer:
    """The real tokenizer with ``pad_token_id = -1``, for TL 2.18's mask-from-zeros step."""

    pad_token_id = -1

    def __init__(self, tokenizer):
        object.__setattr__(self, "_tok", tokenizer)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __setattr__(self, name, value):
        setattr(self._tok, name, value)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)


def _lane(model) -> str:
    from .sites import lane_of

    return lane_of(model)


def _needs_pad_view(model) -> bool:
    tok = getattr(model, "tokenizer", None)
    return tok is not None and getattr(tok, "pad_token_id", None) == 0


def _legacy_generate(model, original):
    @functools.wraps(original)
    def generate(input="", *args, **kwargs):
        if not _needs_pad_view(model):
            return original(input, *args, **kwargs)
        tok = model.tokenizer
        if isinstance(input, (str, list)):  # tokenise with the real pad id, as generate would
            input = model.to_tokens(input, prepend_bos=kwargs.get("prepend_bos"),
                                    padding_side=kwargs.get("padding_side"))
            if kwargs.get("return_type", "input") == "input":
                kwargs["return_type"] = "str"
            kwargs.pop("prepend_bos", None)
        model.tokenizer = _NoPadTokenizer(tok)
        try:
            return original(input, *args, **kwargs)
        finally:
            model.tokenizer = tok

    return generate


def kv_cache_matches(model) -> bool:
    """Whether one KV-cached step gives the logits of the full forward pass (bridge lane).

    Checked on a short fixed token sequence, in the model's dtype tolerance; the
    result is stored on the model.
    """
    known = getattr(model, "_tld_kv_cache_ok", None)
    if known is not None:
        return known
    from .adapter import device_of
    from .sites import dtype_tolerance

    device = device_of(model)
    n_vocab = int(model.cfg.d_vocab)
    tokens = (torch.arange(2, 8, device=device) * 7919 % n_vocab).unsqueeze(0).long()
    with torch.no_grad():
        full = model(tokens)[:, -1].float()
        _, past = model(tokens[:, :-1], return_type="logits_and_cache")
        step = model(tokens[:, -1:], past_key_values=past)[:, -1].float()
    tol = max(1e-3, 10 * dtype_tolerance(full.dtype)) * max(1.0, float(full.abs().max()))
    ok = bool((full - step).abs().max() <= tol)
    model._tld_kv_cache_ok = ok
    return ok


def _bridge_generate(model, original):
    @functools.wraps(original)
    def generate(input="", *args, use_past_kv_cache: bool = False, **kwargs):
        if use_past_kv_cache and not kv_cache_matches(model):
            from importlib.metadata import version

            raise ValueError(
                f"use_past_kv_cache=True: on this TransformerLens {version('transformer-lens')} bridge "
                f"({getattr(model.cfg, 'model_name', 'model')}) one KV-cached step does not reproduce "
                "the full forward pass (an upstream bug), so cached generation would give wrong "
                "tokens. Pass use_past_kv_cache=False (tl_directional's default on the bridge)."
            )
        return original(input, *args, use_past_kv_cache=use_past_kv_cache, **kwargs)

    return generate


def _marked_generating(generate):
    """``generate`` with the edits told that a generation is running (positions beyond
    the prompt are reached later, so the edits do not call them out of range)."""

    @functools.wraps(generate)
    def wrapped(*args, **kwargs):
        from .edit import _FORWARD

        _FORWARD.generating += 1
        try:
            return generate(*args, **kwargs)
        finally:
            _FORWARD.generating -= 1
    return wrapped


def fix_generate(model):
    """Install the corrected ``generate`` on ``model`` (idempotent); returns ``model``.

    Models without ``generate`` (encoders) are returned unchanged.
    """
    if getattr(model, _MARK, False) or not callable(getattr(model, "generate", None)):
        return model
    original = model.generate
    lane = _lane(model)
    wrapped = _bridge_generate(model, original) if lane == "bridge" else _legacy_generate(model, original)
    object.__setattr__(model, "generate", _marked_generating(wrapped))
    object.__setattr__(model, _MARK, True)
    return model


__all__ = ["fix_generate", "kv_cache_matches"]
