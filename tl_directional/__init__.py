"""tl-directional: parallel / perpendicular decomposition of transformer updates.

Split every update against the stream it is added to (residual space) or
against each token's own value vector (value space), on TransformerLens hook
points. See METHOD.md (docs/method.md) for every definition.
"""

from .compression import CompatibilityError, compress_check, compression_geometry
from .compression.compressors import (
    CompressionRecord,
    CompressionResult,
    compress,
    drop_layers,
    low_rank,
    prune_magnitude,
    prune_wanda,
    quantize_awq,
    quantize_rtn,
)
from .compression.ranking import ranking_overlap
from .compression.save import save_compressed
from .compression.weighted import prune_wanda_weighted
from .core.bootstrap import bootstrap_mean_interval, random_subspace_share
from .core.direction import Direction, DirectionError, DirectionMismatchError
from .core.errors import TLDirectionalError
from .core.geometry import (
    Decomposition,
    component_delta,
    decompose,
    patch_components,
    scale_components,
)
from .core.subspace import SubspaceError, orthonormal_basis, random_energy_share, split_against
from .edit import (
    ActivationAddition,
    DiagonalRemoval,
    Edit,
    EditStrength,
    EffectiveDiagonal,
    MLPCarrierScale,
    ResidualScale,
    Scales,
    SteeringReport,
    ValueScale,
    apply_edits,
    edit_hooks,
    edit_strength,
    hf,  # noqa: F401  the plain-transformers lane (install_edits, handles, the supported families)
    scales,
)
from .evaluate import (
    AttributionError,
    DirectionalResult,
    PatchingInputError,
    PathPatchError,
    Setting,
    SplitLensResult,
    attribution_hooks,
    attribution_patch,
    directional_patch,
    directional_patch_attn,
    directional_patch_mlp,
    directional_patch_resid_pre,
    directional_patch_value,
    find_safe_scale,
    generic_directional_patch,
    grid,
    path_patch,
    random_scales,
    random_setting,
    split_logit_attribution,
    split_logit_lens,
    sweep,
)
from .measure import (
    Profile,
    SAEError,
    SAESplit,
    SAEWeights,
    StackSplit,
    StackSplitError,
    load_sae_weights,
    mean_difference_direction,
    probe_direction,
    profile,
    required_hooks,
    sae_directions,
    sae_split,
    split_decompose_resid,
    split_stack_head_results,
    unembedding_direction,
)
from .model.handle import clone_model
from .model.inputs import TokenBatch, prepare_inputs
from .model.load import load_default_model, load_model
from .model.positions import first_token_mask
from .model.reference import Reference, resolve_reference
from .model.sites import ModelSites, SiteResolutionError, WeightProcessingWarning, resolve_sites
from .model.split_hooks import attach_split_hook_points, split_hook_points
from .model.verify import verify_sites

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
    # cache-level splits in TransformerLens's stack shapes, against the stream or any direction
    "split_decompose_resid",
    "split_stack_head_results",
    "StackSplit",
    "StackSplitError",
    "orthonormal_basis",
    "split_against",
    "random_energy_share",
    "SubspaceError",
    "Direction",
    "DirectionError",
    "DirectionMismatchError",
    # SAE features as directions; an SAE's reconstruction and error term against the stream
    "sae_directions",
    "sae_split",
    "SAESplit",
    "SAEWeights",
    "load_sae_weights",
    "SAEError",
    # directions from where people get them (each a Direction with its provenance)
    "unembedding_direction",
    "probe_direction",
    "mean_difference_direction",
    # the one resolver every reference= goes through
    "Reference",
    "resolve_reference",
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
    "MLPCarrierScale",
    # a steering vector added to the stream, its parallel and perpendicular parts scaled apart
    "ActivationAddition",
    "SteeringReport",
    "Scales",
    "scales",
    "apply_edits",
    "edit_hooks",
    "edit_strength",
    "EditStrength",
    "scale_components",
    "patch_components",
    # evaluate: sweeps, safe scales, directional patching
    "Setting",
    "grid",
    "sweep",
    "random_scales",
    "random_setting",
    "find_safe_scale",
    "directional_patch",
    "directional_patch_attn",
    "directional_patch_mlp",
    "directional_patch_resid_pre",
    "directional_patch_value",
    "generic_directional_patch",
    "split_logit_attribution",
    "path_patch",
    "PathPatchError",
    # evaluate: directional attribution patching and the one result type
    "attribution_patch",
    "attribution_hooks",
    "DirectionalResult",
    "AttributionError",
    "PatchingInputError",
    "bootstrap_mean_interval",
    "random_subspace_share",
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
    "prune_wanda_weighted",
    "ranking_overlap",
    "quantize_awq",
    "quantize_rtn",
    "save_compressed",
    "CompatibilityError",
    "compression_geometry",
    "compress_check",
    # train and show: import from the training modules and from tl_directional.views / .report
]
