"""Protocol sec. 13's scorer and pilot rule, as pure functions of token ids and log-likelihoods.

An item (:class:`studies.ruler.items.Item`) is a four-way choice read by likelihood (sec. 13.1):
each candidate is the continuation ``" " + candidate`` of the prompt, scored by the summed
log-likelihood of its tokens given the prompt (lm-eval's ``loglikelihood``; the forwards are
:func:`tl_directional.evaluate.suites.accuracy.loglikelihoods`); the highest wins and a tie at the
top counts as wrong. No generation and no exact-match parsing: the multi-key and common-words
answers are candidates like any other, so "exact match" is choosing the right one of the four.

The pilot rule (sec. 13.2) picks one rung of each task's ladder from the unedited model's pilot
accuracies: the hardest rung at or above :data:`PILOT_FLOOR`, else the easiest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

try:  # TransformerLens 2 (the legacy lane): HookedTransformer's KV cache, exact (sec. 13.8)
    from transformer_lens import HookedTransformer
    from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache
except ImportError:  # TransformerLens 4 (the bridge lane): no HookedTransformer; the bridge's
    HookedTransformer = HookedTransformerKeyValueCache = None  # cached logits are wrong on both models

#: sec. 13.2: a rung is kept when the pilot's baseline accuracy reaches this fraction
PILOT_FLOOR = 0.60
#: sec. 13.2: a task on its easiest rung gets no verdict if the main baseline's lower bound at
#: 512 tokens is below chance (0.25) plus 10 points
VERDICT_FLOOR = 0.35

Encode = Callable[[str], list[int]]


def continuation_ids(encode: Encode, prompt: str, candidate: str) -> list[int]:
    """The token ids of ``" " + candidate`` after ``prompt``, lm-eval's way: the whole
    ``prompt + " " + candidate`` encoded, less the prompt's own ids, where the prompt's encoding is
    a prefix of the whole one (a merge across the boundary would make it not); otherwise
    ``" " + candidate`` encoded alone. ``encode`` maps text to ids without special tokens."""
    ctx, whole = encode(prompt), encode(prompt + " " + candidate)
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return whole[len(ctx):]
    return encode(" " + candidate)


def item_requests(encode: Encode, bos: int | None, prompt: str,
                  choices: Sequence[str]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The four ``(context, continuation)`` id pairs of one item, in choice order: the context is
    ``bos`` (when not None, as the model's forward sees text) then the prompt's ids."""
    ctx = ([bos] if bos is not None else []) + encode(prompt)
    return [(tuple(ctx), tuple(continuation_ids(encode, prompt, c))) for c in choices]


def shared_prefix_supported(model) -> bool:
    """Whether :func:`shared_prefix_loglikelihoods` runs on ``model``: a TransformerLens 2
    ``HookedTransformer`` (the legacy lane)."""
    return HookedTransformer is not None and isinstance(model, HookedTransformer)


def shared_prefix_loglikelihoods(model, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """``[n]`` float64: :func:`tl_directional.evaluate.suites.accuracy.loglikelihoods` of requests
    that share one context (an item's four candidates), with the context run once (sec. 13.8).

    The context less its last token runs once, batch 1, into a KV cache (no unembedding); the
    cache is shared by ``n`` suffixes, each the context's last token and its continuation less its
    own last token (right-padded with its last token: causal, the padding is never read), whose
    logits score the continuation, log-softmax in float64. Causal attention makes the context's
    positions the same in every candidate's forward, so only the order of float32 reductions
    differs from the batched path (the tests bound it by round-off). Hooks active on ``model``
    (an edit's context) act on every position of both forwards, as in one forward.

    Raises:
        ValueError: ``model`` is not a TransformerLens 2 ``HookedTransformer`` (the legacy lane;
            TransformerLens 4.3's bridge gives wrong logits from its KV cache), or the requests do
            not share one context of at least two tokens.
    """
    if not shared_prefix_supported(model):
        raise ValueError(f"model is a {type(model).__name__}: the shared-prefix scorer needs TransformerLens 2's "
                         f"HookedTransformer (the legacy lane, .venv-legacy); use loglikelihoods() on the bridge")
    ctx = list(requests[0][0]) if requests else []
    if len(ctx) < 2 or any(list(c) != ctx for c, _ in requests):
        raise ValueError(f"requests: {len(requests)} with contexts of lengths {[len(c) for c, _ in requests]}: "
                         f"they must share one context of at least 2 tokens; use loglikelihoods() otherwise")
    cfg = model.cfg
    cache = HookedTransformerKeyValueCache.init_cache(cfg, cfg.device, 1)
    head = torch.tensor([ctx[:-1]], dtype=torch.long, device=cfg.device)
    # an explicit all-ones mask: TransformerLens 2 would read every pad-id token as padding
    model(head, past_kv_cache=cache, attention_mask=torch.ones_like(head), return_type=None)
    n = len(requests)
    for e in cache.entries:
        e.past_keys = e.past_keys.expand(n, *e.past_keys.shape[1:])
        e.past_values = e.past_values.expand(n, *e.past_values.shape[1:])
    cache.previous_attention_mask = cache.previous_attention_mask.expand(n, -1)
    seqs = [[ctx[-1], *list(cont)[:-1]] for _, cont in requests]
    width = max(len(q) for q in seqs)
    ids = torch.tensor([q + [q[-1]] * (width - len(q)) for q in seqs], dtype=torch.long, device=cfg.device)
    logits = model(ids, past_kv_cache=cache, attention_mask=torch.ones_like(ids))
    out = []
    for j, (_, cont) in enumerate(requests):
        lp = torch.log_softmax(logits[j, : len(cont)].double(), -1)
        out.append(lp[torch.arange(len(cont)), torch.tensor(list(cont), device=lp.device)].sum().cpu())
    return torch.stack(out)


def chosen(lls: Sequence[float]) -> int:
    """The index of the unique highest log-likelihood, or -1 when the top is tied (sec. 13.1: a
    tie counts as wrong, so it matches no answer)."""
    top = max(lls)
    best = [k for k, v in enumerate(lls) if v == top]
    return best[0] if len(best) == 1 else -1


def is_correct(lls: Sequence[float], answer: int) -> bool:
    """Whether the item's four log-likelihoods pick ``answer`` (a tie at the top is wrong)."""
    return chosen(lls) == answer


def pick_rungs(accuracy: Mapping[str, Mapping[int, float]], ladders: Mapping[str, Sequence[int]],
               fits: Mapping[str, Mapping[int, bool]] | None = None) -> dict[str, dict]:
    """Sec. 13.2's choice per task with a ladder: ``{task: {"rung": d, "pilot_accuracy": a,
    "reached_floor": bool}}``, the hardest rung (last of the ladder, which runs easiest first)
    whose pilot accuracy is at least :data:`PILOT_FLOOR`, else the easiest rung. With ``fits``
    (sec. 13.6: whether a rung's items fit the main run's shortest length), only fitting rungs
    are candidates.

    Raises:
        ValueError: a task of ``ladders`` without a pilot accuracy for every rung, or whose
            easiest rung does not fit.
    """
    out = {}
    for task, ladder in ladders.items():
        acc = accuracy.get(task, {})
        missing = [d for d in ladder if d not in acc]
        if missing:
            raise ValueError(f"accuracy[{task!r}] lacks rungs {missing} of {list(ladder)}: score every rung "
                             f"on the pilot before picking")
        fit = [d for d in ladder if fits is None or fits[task][d]]
        if not fit or fit[0] != ladder[0]:
            raise ValueError(f"fits[{task!r}] = {dict(fits[task])}: the easiest rung {ladder[0]} must fit the "
                             f"shortest length; use longer lengths")
        ok = [d for d in fit if acc[d] >= PILOT_FLOOR]
        rung = ok[-1] if ok else ladder[0]
        out[task] = {"rung": rung, "pilot_accuracy": acc[rung], "reached_floor": bool(ok)}
    return out
