"""Which tiny-model families each TransformerLens lane supports in tl_directional.

Read from the family registry (``tl_directional.model.families.REGISTRY``, one file per family):

* ``CAUSAL`` / ``ALL``: the original families, which the whole suite parametrises over.
* ``LOADABLE``: every registered family that loads on the installed lane.
* ``EXTRA``: the other causal families of ``LOADABLE`` (gemma3, qwen2, ...), which
  ``tests/integration/test_families.py`` puts through the same checks.
* ``REFUSED``: the registered families this lane refuses (with a clear error).
"""

from tl_directional.model.families import REGISTRY, lane_families
from tl_directional.model.load import tl_lane

# Legacy BERT is a HookedEncoder, which tl_directional does not support (post-LN sites
# are resolved on the bridge only).
CAUSAL = ("gpt2", "llama", "neox")
ALL = CAUSAL + (("bert",) if tl_lane() == "bridge" else ())
LOADABLE = lane_families(tl_lane())
EXTRA = tuple(f for f in lane_families(tl_lane(), causal_only=True) if f not in CAUSAL)
REFUSED = tuple(f for f in REGISTRY if f not in LOADABLE)
