"""tl-directional: parallel / perpendicular decomposition of transformer updates.

Split every update against the stream it is added to (residual space) or
against each token's own value vector (value space), on TransformerLens hook
points. See METHOD.md (docs/method.md) for every definition.
"""

from .geometry import Decomposition, decompose, patch_components, scale_components
from .inputs import TokenBatch, first_token_mask, prepare_inputs
from .measure import Profile, profile
from .sites import (
    ModelSites,
    SiteResolutionError,
    WeightProcessingWarning,
    resolve_sites,
    verify_sites,
)

__version__ = "0.1.0"

__all__ = [
    "Decomposition",
    "ModelSites",
    "Profile",
    "SiteResolutionError",
    "TokenBatch",
    "WeightProcessingWarning",
    "decompose",
    "first_token_mask",
    "patch_components",
    "prepare_inputs",
    "profile",
    "resolve_sites",
    "scale_components",
    "verify_sites",
]
