"""Which modules of a model make its forward random in training mode.

Training mode matters only where a module's forward draws random numbers: dropout with ``p > 0``
(``nn.Dropout`` modules, or the float rate Hugging Face attention passes to its functional
dropout, ``attention_dropout``), batch-norm statistics, a mixture-of-experts router's jitter. A
``HookedTransformer`` has no dropout at all (TransformerLens never implemented it) and
``HookedTransformer.from_pretrained`` returns it in training mode; a checkpoint whose dropout
rates are 0 (the bundled model, SmolLM2, Gemma-3) gives the same numbers in either mode. Refusing
those would be noise; refusing a model whose dropout is live is what keeps two identical calls
equal.
"""

from __future__ import annotations

from torch import nn

#: float attributes Hugging Face modules read as a random rate while ``self.training``
RATE_ATTRIBUTES = ("attention_dropout", "attn_dropout", "dropout", "hidden_dropout", "dropout_p",
                   "router_jitter_noise", "jitter_noise")


def _rate(module: nn.Module) -> float:
    """The largest random rate ``module`` applies in training mode (0.0 when it draws nothing)."""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return float(module.p)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return 1.0  # batch statistics: the output depends on the rest of the batch
    rates = [getattr(module, a, None) for a in RATE_ATTRIBUTES]
    return max([float(r) for r in rates if isinstance(r, float)], default=0.0)


def random_in_training(model) -> list[tuple[str, float]]:
    """``(name, rate)`` of every module of ``model`` that is in training mode and draws random
    numbers there (``rate > 0``), in module order; empty when the forward is deterministic."""
    if not hasattr(model, "named_modules"):
        return []
    found = []
    for name, module in model.named_modules():
        if module.training:
            rate = _rate(module)
            if rate > 0:
                found.append((name.replace("._original_component", ""), rate))
    return found
