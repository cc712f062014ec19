"""A decoder's shape: the one description the benchmarks' cost models read.

:mod:`benchmarks.floors` counts matrix products from it, :mod:`benchmarks.memory_model` counts
bytes from it, and :mod:`benchmarks.scaling`'s sizes give theirs (``Size.shape``); the weights
themselves are not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A decoder's depth, widths, heads and vocabulary.

    ``d_head`` 0 means ``d_model / n_heads`` (:attr:`dh`); ``gated_mlp`` False is a two-matrix
    MLP (GPT-2), True a gate / up / down one (Llama, Qwen, Gemma); ``tied``: the unembedding is
    the embedding's transpose (stored once: it changes :meth:`parameters`, not the compute).
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    vocab: int
    d_head: int = 0
    gated_mlp: bool = True
    tied: bool = False

    @property
    def dh(self) -> int:
        """A head's width."""
        return self.d_head or self.d_model // self.n_heads

    @classmethod
    def of(cls, obj) -> Shape:
        """From a ``benchmarks.scaling.Size`` (gated, untied, head width ``d_model / n_heads``, as
        the family builds it), a TransformerLens config (``model.cfg`` of either lane) or a model
        with one. In a config, ``n_key_value_heads`` None means one key/value head per query head."""
        cfg = getattr(obj, "cfg", obj)
        if hasattr(cfg, "vocab_size"):  # a scaling Size
            return cls(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_mlp, cfg.vocab_size)
        kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return cls(cfg.n_layers, cfg.d_model, cfg.n_heads, kv, cfg.d_mlp, cfg.d_vocab, getattr(cfg, "d_head", 0) or 0,
                   bool(getattr(cfg, "gated_mlp", False)))

    def parameters(self) -> int:
        """Parameters of a decoder of this shape without biases: attention, MLP and two norms per
        block, the final norm, the embedding and (untied) the unembedding."""
        attn = self.d_model * self.dh * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = (3 if self.gated_mlp else 2) * self.d_model * self.d_mlp
        embed = (1 if self.tied else 2) * self.vocab * self.d_model
        return self.n_layers * (attn + mlp + 2 * self.d_model) + embed + self.d_model


__all__ = ["Shape"]
