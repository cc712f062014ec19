"""tl-directional: parallel / perpendicular decomposition of transformer updates.

Split every update against the stream it is added to (residual space) or
against each token's own value vector (value space), on TransformerLens hook
points. See METHOD.md (docs/method.md) for every definition.
"""

from .compression import CompatibilityError, compress_check, compression_geometry
from .compression.compressors import (
    CompressionRecord,
    CompressionResult,
    clone_model,
    compress,
    drop_layers,
    low_rank,
    prune_magnitude,
    prune_wanda,
    quantize_awq,
    quantize_rtn,
    save_compressed,
)
from .core.errors import TLDirectionalError
from .core.geometry import (
    Decomposition,
    component_delta,
    decompose,
    patch_components,
    scale_components,
)
from .edit import (
    DiagonalRemoval,
    Edit,
    EffectiveDiagonal,
    ResidualScale,
    Scales,
    ValueScale,
    apply_edits,
    edit_hooks,
    hf,  # noqa: F401  plain-transformers edits; its Trainer / lm-eval parts import lazily
    scales,
)
from .evaluate.lens import SplitLensResult, split_logit_lens
from .evaluate.patching import directional_patch, split_logit_attribution
from .evaluate.sweep import Setting, find_safe_scale, grid, sweep
from .measure import Profile, profile
from .measure.cache_hooks import required_hooks
from .model.inputs import TokenBatch, first_token_mask, prepare_inputs
from .model.load import load_default_model, load_model
from .model.sites import (
    ModelSites,
    SiteResolutionError,
    WeightProcessingWarning,
    resolve_sites,
    verify_sites,
)
from .model.split_hooks import attach_split_hook_points, split_hook_points

__version__ = "0.1.0"

__all__ = [
    # the one base of every package error
    "TLDirectionalError",
    # measure: split updates against the stream, profile a model, resolve its sites
    "Decomposition",
    "decompose",
    "component_delta",
    "TokenBatch",
    "prepare_inputs",
    "first_token_mask",
    "Profile",
    "profile",
    "required_hooks",
    "ModelSites",
    "SiteResolutionError",
    "WeightProcessingWarning",
    "resolve_sites",
    "verify_sites",
    "attach_split_hook_points",
    "split_hook_points",
    "load_default_model",
    "load_model",
    # edit: scale or patch the parallel / perpendicular parts
    "Edit",
    "ValueScale",
    "ResidualScale",
    "DiagonalRemoval",
    "EffectiveDiagonal",
    "Scales",
    "scales",
    "apply_edits",
    "edit_hooks",
    "scale_components",
    "patch_components",
    # evaluate: sweeps, safe scales, directional patching
    "Setting",
    "grid",
    "sweep",
    "find_safe_scale",
    "directional_patch",
    "split_logit_attribution",
    "split_logit_lens",
    "SplitLensResult",
    # compress: compressors, their error geometry and the label-free gate
    "CompressionRecord",
    "CompressionResult",
    "clone_model",
    "compress",
    "drop_layers",
    "low_rank",
    "prune_magnitude",
    "prune_wanda",
    "quantize_awq",
    "quantize_rtn",
    "save_compressed",
    "CompatibilityError",
    "compression_geometry",
    "compress_check",
    # train and show: import from the training modules and from tl_directional.views / .report
]
