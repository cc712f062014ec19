"""Which tiny-model families each TransformerLens lane supports in tl_directional."""

from tl_directional.models import tl_lane

# Legacy BERT is a HookedEncoder, which tl_directional does not support (post-LN sites
# are resolved on the bridge only).
CAUSAL = ("gpt2", "llama", "neox")
ALL = CAUSAL + (("bert",) if tl_lane() == "bridge" else ())
