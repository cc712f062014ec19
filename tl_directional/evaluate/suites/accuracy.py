"""An offline multiple-choice suite cut from a text's own token windows (protocol sec. 9.4).

Two item kinds, both in token space of one tokenizer:

* :class:`ClozeItem`: at position ``p`` of a window, the true next token ``tokens[p + 1]``
  against three distractors from the same frequency band of the text's token counts. Scored from
  the logits a perplexity forward already computed at ``p`` (no extra forward).
* :class:`ContinuationItem`: a context (a window's first tokens) and four continuations of one
  token length, the true one and three spans cut from other windows of the same text, scored in
  the HellaSwag manner by length-normalised log-likelihood (sum of log-probabilities over the
  continuation divided by its token count; all four have the same count).

Items are a pure function of the windows and a seed, frozen dataclasses that round-trip through
``to_json`` / ``from_json``. The scorers take a TransformerLens model and unembed only the
positions they read (:func:`cloze_choices`, :func:`loglikelihoods`), or logits already computed
(:func:`cloze_choice_logits`) or any causal callable (:func:`loglikelihoods`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tl_directional.core.errors import TLDirectionalError
from tl_directional.model.handle import logits_at

N_CHOICES = 4


class AccuracySuiteError(TLDirectionalError, ValueError):
    """An argument of the multiple-choice suite is out of its valid range."""


@dataclass(frozen=True)
class ClozeItem:
    """A four-way next-token choice: the logits at ``position`` of window ``window`` pick among
    ``choices`` (token ids); ``choices[answer]`` is the token at ``position + 1``. ``hard``: the
    distractors are the unedited model's most likely wrong tokens (:func:`hard_cloze_items`, kind
    ``"cloze-hard"``), else drawn from the truth's frequency band (kind ``"cloze"``)."""

    text: str
    window: int
    position: int
    choices: tuple[int, ...]
    answer: int
    hard: bool = False

    def to_json(self) -> dict:
        return {
            "kind": "cloze-hard" if self.hard else "cloze",
            "text": self.text,
            "window": self.window,
            "position": self.position,
            "choices": list(self.choices),
            "answer": self.answer,
        }

    @classmethod
    def from_json(cls, d: dict) -> ClozeItem:
        return cls(
            d["text"],
            int(d["window"]),
            int(d["position"]),
            tuple(int(c) for c in d["choices"]),
            int(d["answer"]),
            d.get("kind") == "cloze-hard",
        )


@dataclass(frozen=True)
class ContinuationItem:
    """A four-way continuation choice: ``context`` (token ids, a window's opening) and
    ``choices`` (four token-id spans of one length); ``choices[answer]`` follows the context in
    window ``window``."""

    text: str
    window: int
    context: tuple[int, ...]
    choices: tuple[tuple[int, ...], ...]
    answer: int

    def to_json(self) -> dict:
        return {
            "kind": "continuation",
            "text": self.text,
            "window": self.window,
            "context": list(self.context),
            "choices": [list(c) for c in self.choices],
            "answer": self.answer,
        }

    @classmethod
    def from_json(cls, d: dict) -> ContinuationItem:
        return cls(
            d["text"],
            int(d["window"]),
            tuple(int(t) for t in d["context"]),
            tuple(tuple(int(t) for t in c) for c in d["choices"]),
            int(d["answer"]),
        )


def frequency_bands(tokens: Sequence[int], n_bands: int = 8) -> dict[int, int]:
    """``{token id: band}`` over the distinct ids of ``tokens`` (a text's token stream): ids
    ranked by count in the stream (ties by id), cut into ``n_bands`` bands of (nearly) equal
    numbers of distinct ids; band 0 holds the most frequent."""
    if n_bands < 1:
        raise AccuracySuiteError(f"n_bands={n_bands}: must be at least 1; pass e.g. 8")
    counts = Counter(int(t) for t in tokens)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    n = len(ranked)
    return {t: min(i * n_bands // max(n, 1), n_bands - 1) for i, t in enumerate(ranked)}


def _check_windows(windows: Tensor) -> None:
    if windows.ndim != 2:
        raise AccuracySuiteError(
            f"windows has shape {tuple(windows.shape)}: must be [n_windows, seq]; "
            "pass the token ids of full windows"
        )


def build_cloze_items(
    windows: Tensor,
    bands: dict[int, int],
    *,
    text: str,
    per_window: int,
    seed: int = 0,
    first_position: int = 1,
) -> list[ClozeItem]:
    """``per_window`` cloze items per row of ``windows`` (``[n_windows, seq]`` token ids of full,
    unpadded windows), positions drawn without replacement from
    ``[first_position, seq - 2]`` (``first_position = 1`` skips the position that reads BOS only),
    each with three distractors drawn from the truth's band of ``bands``
    (:func:`frequency_bands` of the same text), distinct and never the truth. Positions whose
    band holds fewer than four ids are not drawn. Deterministic in ``(seed, text)``."""
    _check_windows(windows)
    seq = windows.shape[1]
    if not 0 <= first_position <= seq - 2:
        raise AccuracySuiteError(
            f"first_position={first_position}: must lie in [0, {seq - 2}] for windows of "
            f"{seq} tokens"
        )
    by_band: dict[int, list[int]] = {}
    for t, b in sorted(bands.items()):
        by_band.setdefault(b, []).append(t)
    rng = random.Random(f"cloze:{seed}:{text}")
    rows = windows.tolist()
    items = []
    for w, row in enumerate(rows):
        ok = [
            p
            for p in range(first_position, seq - 1)
            if row[p + 1] in bands and len(by_band[bands[row[p + 1]]]) >= N_CHOICES
        ]
        if len(ok) < per_window:
            raise AccuracySuiteError(
                f"per_window={per_window}: window {w} of {text} has only {len(ok)} usable "
                f"positions; pass per_window {len(ok)} or less"
            )
        for p in sorted(rng.sample(ok, per_window)):
            truth = row[p + 1]
            pool = [t for t in by_band[bands[truth]] if t != truth]
            choices = [truth, *rng.sample(pool, N_CHOICES - 1)]
            rng.shuffle(choices)
            items.append(ClozeItem(text, w, p, tuple(choices), choices.index(truth)))
    return items


def hard_cloze_items(items: Sequence[ClozeItem], ranked: Tensor, *, seed: int = 0) -> list[ClozeItem]:
    """Hard twins of cloze ``items`` (protocol sec. 9.7): the same window, position and truth, with
    the three distractors the unedited model ranks highest among the wrong tokens (its ranks 2-4
    when it ranks the truth first). ``ranked``: ``[n_items, k]`` token ids, ``k >= 4``, the
    unedited model's top-``k`` at each item's position in descending logit order (``topk`` of its
    logits there). Choices shuffled from ``random.Random(f"hard:{seed}:{text}")``; deterministic."""
    if ranked.ndim != 2 or ranked.shape[0] != len(items) or ranked.shape[1] < N_CHOICES:
        raise AccuracySuiteError(
            f"ranked has shape {tuple(ranked.shape)}: must be [{len(items)}, k] with k >= {N_CHOICES}, the "
            "unedited model's top-k token ids at each item's position (logits.topk(4).indices)")
    out = []
    rngs: dict[str, random.Random] = {}
    for it, row in zip(items, ranked.tolist(), strict=True):
        truth = it.choices[it.answer]
        choices = [truth, *[t for t in row if t != truth][: N_CHOICES - 1]]
        rng = rngs.setdefault(it.text, random.Random(f"hard:{seed}:{it.text}"))
        rng.shuffle(choices)
        out.append(ClozeItem(it.text, it.window, it.position, tuple(choices), choices.index(truth), hard=True))
    return out


def build_continuation_items(
    windows: Tensor,
    *,
    text: str,
    per_window: int,
    context_len: int,
    continuation_len: int,
    seed: int = 0,
) -> list[ContinuationItem]:
    """``per_window`` continuation items per row of ``windows`` (``[n_windows, seq]``): the
    context is the window's tokens ``[0, c)`` (with its BOS) for a ``c`` drawn from
    ``[context_len, min(2 * context_len, seq - continuation_len)]``, the truth the next ``continuation_len`` tokens,
    the three distractors spans of the same length from elsewhere in ``windows`` (never
    position 0, never overlapping the true span, never equal to the truth or each other).
    Deterministic in ``(seed, text)``."""
    _check_windows(windows)
    n, seq = windows.shape
    if context_len < 1 or continuation_len < 1 or context_len + continuation_len > seq:
        raise AccuracySuiteError(
            f"context_len={context_len}, continuation_len={continuation_len}: both at least "
            f"1 and their sum at most the window length {seq}"
        )
    rng = random.Random(f"continuation:{seed}:{text}")
    rows = [tuple(r) for r in windows.tolist()]
    items = []
    for w, row in enumerate(rows):
        for _ in range(per_window):
            # contexts of context_len to 2 * context_len tokens: each choice is a forward of its own
            c = rng.randint(context_len, min(2 * context_len, seq - continuation_len))
            truth = row[c : c + continuation_len]
            choices, tries = [truth], 0
            while len(choices) < N_CHOICES:
                tries += 1
                if tries > 10_000:  # too little text for three distinct spans elsewhere
                    raise AccuracySuiteError(
                        f"windows of shape {tuple(windows.shape)} hold no three distinct {continuation_len}-token "
                        "spans apart from the truth; pass more or longer windows"
                    )
                o = rng.randrange(n)
                s = rng.randint(1, seq - continuation_len)
                if o == w and abs(s - c) < continuation_len:
                    continue  # elsewhere in the text: never overlapping the true span
                span = rows[o][s : s + continuation_len]
                if span not in choices:
                    choices.append(span)
            rng.shuffle(choices)
            items.append(ContinuationItem(text, w, row[:c], tuple(choices), choices.index(truth)))
    return items


def cloze_choice_logits(
    logits: Tensor, items: Sequence[ClozeItem], window_offset: int = 0
) -> Tensor:
    """``[n_items, 4]`` logits of each item's choices read from ``logits`` (``[batch, seq,
    d_vocab]``, the forward of windows ``window_offset ..``): row ``window - window_offset``,
    position ``position``. Argmax over a row is the model's choice (log-softmax would not change
    it)."""
    b = torch.tensor(
        [it.window - window_offset for it in items], dtype=torch.long, device=logits.device
    )
    p = torch.tensor([it.position for it in items], dtype=torch.long, device=logits.device)
    c = torch.tensor([it.choices for it in items], dtype=torch.long, device=logits.device)
    if len(items) and (int(b.min()) < 0 or int(b.max()) >= logits.shape[0]):
        raise AccuracySuiteError(
            f"items name windows outside [{window_offset}, {window_offset + logits.shape[0]}); "
            "pass the items of this batch only"
        )
    return logits[b.unsqueeze(-1), p.unsqueeze(-1), c]


def cloze_choices(
    model, windows: Tensor, items: Sequence[ClozeItem], window_offset: int = 0
) -> Tensor:
    """``[n_items, 4]``: :func:`cloze_choice_logits` of a TransformerLens ``model``'s forward on
    ``windows`` (``[batch, seq]``, windows ``window_offset ..``), with only the items' positions
    unembedded (:func:`~tl_directional.model.handle.logits_at`; each position once, however many
    items read it). Hooks active on the model apply (an edit's context)."""
    _check_windows(windows)
    b = [it.window - window_offset for it in items]
    if items and (min(b) < 0 or max(b) >= windows.shape[0]):
        raise AccuracySuiteError(
            f"items name windows outside [{window_offset}, {window_offset + windows.shape[0]}); "
            "pass the items of this batch only"
        )
    rows = sorted({(w, it.position) for w, it in zip(b, items, strict=True)})
    if not rows:
        return torch.zeros(0, N_CHOICES)
    at = {r: k for k, r in enumerate(rows)}
    idx = torch.tensor(rows, dtype=torch.long)
    logits = logits_at(model, windows, idx[:, 0], idx[:, 1])
    r = torch.tensor([at[(w, it.position)] for w, it in zip(b, items, strict=True)], dtype=torch.long)
    c = torch.tensor([it.choices for it in items], dtype=torch.long)
    return logits[r.unsqueeze(-1).to(logits.device), c.to(logits.device)]


def continuation_requests(
    items: Sequence[ContinuationItem],
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The ``(context, continuation)`` token-id pairs of ``items``, four per item in choice order
    (lm-eval's ``loglikelihood`` requests in token form)."""
    return [(it.context, ch) for it in items for ch in it.choices]


def loglikelihoods(
    forward: Callable[[Tensor], Tensor],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_size: int = 16,
) -> Tensor:
    """``[n_requests]`` float64: ``sum_i log p(cont_i | context, cont_<i)`` per request, from
    ``forward``: a TransformerLens model (only the scored positions are unembedded,
    :func:`~tl_directional.model.handle.logits_at`; hooks active on it apply) or any causal
    callable (token ids ``[b, s]`` -> logits ``[b, s, d_vocab]``). Each request runs as
    ``context + continuation[:-1]``, right-padded with its own last token (causal: the padding
    is never read by a scored position)."""
    rows_only = hasattr(forward, "run_with_hooks")
    # longest first, so each batch holds requests of near one length (little padding)
    order = sorted(range(len(requests)), key=lambda k: -(len(requests[k][0]) + len(requests[k][1])))
    out: list[Tensor] = [torch.zeros((), dtype=torch.float64)] * len(requests)
    for i in range(0, len(order), batch_size):
        part = [requests[k] for k in order[i : i + batch_size]]
        seqs = [list(ctx) + list(cont)[:-1] for ctx, cont in part]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s in seqs], dtype=torch.long)
        spans = [range(len(ctx) - 1, len(ctx) - 1 + len(cont)) for ctx, cont in part]
        if rows_only:
            b = torch.tensor([j for j, sp in enumerate(spans) for _ in sp], dtype=torch.long)
            p = torch.tensor([q for sp in spans for q in sp], dtype=torch.long)
            flat = logits_at(forward, ids, b, p)
            starts = [0]
            for sp in spans:
                starts.append(starts[-1] + len(sp))
            logits = [flat[starts[j] : starts[j + 1]] for j in range(len(part))]
        else:
            full = forward(ids)
            logits = [full[j, sp.start : sp.stop] for j, sp in enumerate(spans)]
        for j, (_, cont) in enumerate(part):
            # only the scored rows go to float64 (the whole [b, s, d_vocab] would not fit a large vocabulary)
            lp = torch.log_softmax(logits[j].double(), -1)
            out[order[i + j]] = (
                lp[torch.arange(len(cont)), torch.tensor(list(cont), device=lp.device)].sum().cpu()
            )
        del logits
    return torch.stack(out) if out else torch.zeros(0, dtype=torch.float64)


def continuation_choice_scores(lls: Tensor, items: Sequence[ContinuationItem]) -> Tensor:
    """``[n_items, 4]`` length-normalised log-likelihoods (sum over the continuation divided by
    its token count) from :func:`loglikelihoods` of :func:`continuation_requests`."""
    lens = torch.tensor([[len(c) for c in it.choices] for it in items], dtype=torch.float64)
    return lls.reshape(len(items), N_CHOICES) / lens
