"""Making ``model.generate`` give the tokens a plain forward pass would (both lanes).

Two upstream behaviours make TransformerLens generation disagree with a manual
greedy (argmax) loop over ``model(tokens)``:

* TL 2.18 (``HookedTransformer.generate``) builds each step's attention mask
  from a tensor of zeros compared with ``tokenizer.pad_token_id``. When the pad
  id is 0 (the bundled model and every :func:`~tl_directional.model.load.train_tokenizer`
  tokenizer: one special token, id 0, for BOS, EOS and PAD) every position looks
  like padding and all positional embeddings collapse to position 0. The fix
  hands ``generate`` a view of the tokenizer whose ``pad_token_id`` is -1
  (no token has it) for the duration of the call; tokenisation and decoding
  still use the real tokenizer.
* TL 4 bridges (``TransformerBridge.generate``) give wrong logits with the KV
  cache for some architectures (GPT-2 and Llama shapes on TL 4.3). There
  ``use_past_kv_cache`` defaults to False; passing True first checks, once per
  model, that one cached step reproduces the full forward pass
  (:func:`kv_cache_matches`), and raises a ``ValueError`` naming the fix when it does not.

Each lane's fix is its ``wrap_generate`` (:mod:`tl_directional.model.lanes`).
:func:`fix_generate` installs it on one model instance (idempotent), together with the
flag that tells the edits a generation is running. :func:`~tl_directional.model.load.load_model`
calls it; call it yourself for a model you loaded another way. Nothing else patches
``generate`` (:func:`~tl_directional.edit.apply_edits` does not).
"""

from __future__ import annotations

import functools
import weakref

from torch import Tensor

from .lanes import lane_of


class ForwardState:
    """What the edits' hooks know about the forward pass in progress: its attention mask
    (a ``model(tokens, attention_mask=...)`` keyword, set around the forward by each edit
    path) and whether ``generate`` is running (positions beyond the prompt are then reached
    later, so they are not out of range)."""

    attention_mask: Tensor | None = None
    generating: int = 0
    #: positions already in the KV cache when the forward in progress began (None: unknown), so
    #: that a hook firing before any attention of the pass (``blocks.0.hook_resid_pre``) knows
    #: the absolute position of its first query (:func:`past_length`)
    past_length: int | None = None


FORWARD = ForwardState()
"""The one :class:`ForwardState` the hooks of both edit paths read."""


def past_length(kwargs: dict) -> int:
    """How many positions a forward call's KV cache already holds, read from its keywords: a
    ``cache_position`` tensor (its first entry), a Hugging Face cache (``past_key_values`` /
    ``cache``: ``get_seq_length()``; TL 4 bridges pass it on) or a TL 2 ``past_kv_cache``
    (``HookedTransformerKeyValueCache``: its first entry's ``past_keys`` are ``[batch, pos, ...]``);
    0 without any."""
    cache_position = kwargs.get("cache_position")
    if isinstance(cache_position, Tensor) and cache_position.numel():
        return int(cache_position.reshape(-1)[0])
    for key in ("past_key_values", "cache"):
        past = kwargs.get(key)
        if past is not None and hasattr(past, "get_seq_length"):
            return int(past.get_seq_length())
    legacy = kwargs.get("past_kv_cache")
    entries = getattr(legacy, "entries", None)
    if entries:
        keys = getattr(entries[0], "past_keys", None)
        if isinstance(keys, Tensor) and keys.ndim >= 2:
            return int(keys.shape[1])
    return 0


#: model -> a weak reference to the ``generate`` that :func:`fix_generate` installed on it. Weak:
#: that function closes over the model, and a value that holds its key keeps the model alive for
#: the whole process (every model ever loaded would stay in memory).
_FIXED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _installed(model):
    """The ``generate`` :func:`fix_generate` installed on ``model``, or None."""
    try:
        ref = _FIXED.get(model)
    except TypeError:  # not weak-referenceable
        return None
    return ref() if ref is not None else None


def _marked_generating(generate):
    """``generate`` with the edits told that a generation is running (positions beyond
    the prompt are reached later, so the edits do not call them out of range)."""

    @functools.wraps(generate)
    def wrapped(*args, **kwargs):
        FORWARD.generating += 1
        try:
            return generate(*args, **kwargs)
        finally:
            FORWARD.generating -= 1
    return wrapped


def generate_fixed(model) -> bool:
    """Whether ``model.generate`` is the one :func:`fix_generate` installed on this instance."""
    installed = _installed(model)
    return installed is not None and model.__dict__.get("generate") is installed


def fix_generate(model):
    """Install the corrected ``generate`` on ``model`` (idempotent); returns ``model``.

    Models without ``generate`` (encoders) are returned unchanged. The fix is the model's
    lane's (:meth:`tl_directional.model.lanes.base.Lane.wrap_generate`), wrapped so that the edits
    know a generation is running.
    """
    if generate_fixed(model) or not callable(getattr(model, "generate", None)):
        return model
    wrapped = _marked_generating(lane_of(model).wrap_generate(model, model.generate))
    # straight into the instance dict: the bridge's __setattr__ would forward it to the HF model
    object.__setattr__(model, "generate", wrapped)
    try:
        _FIXED[model] = weakref.ref(wrapped)
    except TypeError:  # pragma: no cover - every TL model is weak-referenceable
        pass
    return model


def carry_generate_fix(model, clone):
    """``clone`` (a copy of ``model``) with its own fixed ``generate`` when ``model``'s is fixed.

    A deep copy carries the original's installed ``generate``, which still runs the original;
    it is dropped before the copy gets its own."""
    if not generate_fixed(model):
        return clone
    if clone is not model and clone.__dict__.get("generate") is _installed(model):
        del clone.__dict__["generate"]
    return fix_generate(clone)


__all__ = ["FORWARD", "ForwardState", "carry_generate_fix", "fix_generate", "generate_fixed", "past_length"]
