"""The scaling family's sizes: decoders of real models' shapes, and the seeded builds of them.

:mod:`benchmarks.scaling` (the driver) and :mod:`benchmarks.memory_model` (the memory model's
checks) both read these; they live apart from the driver so that the driver can use the memory
model without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .shapes import Shape


@dataclass(frozen=True)
class Size:
    """One model shape: the family ``build_tiny_hf_model`` builds and the published dimensions."""

    family: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    vocab_size: int
    source: str  # whose configuration this is

    @property
    def shape(self) -> Shape:
        """The built model's :class:`~benchmarks.shapes.Shape`: gated MLP, head width
        ``d_model / n_heads``, untied unembedding."""
        return Shape.of(self)

    def parameters(self) -> int:
        """Parameters of the built model: the published shape with an untied unembedding (the
        builder unties it, so memory holds ``W_U`` beside ``W_E`` even where the named model
        ties them; compute is the same either way), norms included."""
        return self.shape.parameters()


#: The family's sizes, smallest first. ``tiny`` is for the suite (seconds); the others follow the
#: named models' published ``config.json`` (tied embeddings where the model ties them).
SIZES: dict[str, Size] = {
    "tiny": Size("llama", 2, 64, 4, 2, 128, 512, "a 2-layer seeded Llama for the suite"),
    "smollm2-135m": Size("llama", 30, 576, 9, 3, 1536, 49152, "HuggingFaceTB/SmolLM2-135M"),
    "smollm2-360m": Size("llama", 32, 960, 15, 5, 2560, 49152, "HuggingFaceTB/SmolLM2-360M"),
    "qwen3-0.6b": Size("qwen3", 28, 1024, 16, 8, 3072, 151936, "Qwen/Qwen3-0.6B (head_dim 64 here, 128 there)"),
    "llama-3.2-1b": Size("llama", 16, 2048, 32, 8, 8192, 128256, "meta-llama/Llama-3.2-1B"),
    "qwen2.5-1.5b": Size("qwen2", 28, 1536, 12, 2, 8960, 151936, "Qwen/Qwen2.5-1.5B"),
}


def build(name: str, root: Path) -> Path:
    """The seeded model ``name`` under ``root`` (built once; reused while its files exist)."""
    from tl_directional.model.load import build_tiny_hf_model

    size = SIZES[name]
    path = root / name
    if not (path / "config.json").exists():
        build_tiny_hf_model(size.family, path, seed=0, n_layers=size.n_layers, d_model=size.d_model,
                            n_heads=size.n_heads, n_kv_heads=size.n_kv_heads, d_mlp=size.d_mlp,
                            n_ctx=2048, vocab_size=size.vocab_size)
    return path
