"""Train a small GPT-2 with a directional edit active in every forward pass (METHOD.md sec. 7).

One entry point, three variants, identical in everything but the edit:

* ``baseline``: no edit.
* ``vpara``: value-space full-aggregate parallel removal (edit space ``"value"``, i.e.
  ``ValueScale(s_par=0.0, mode="full")``) in every layer and head (each head's output ``o_t``
  loses its part along the token's own value ``v_t``).
* ``attn-para``: residual-space attention parallel removal (edit space ``"resid-attn"``, i.e.
  ``ResidualScale("attn", s_par=0.0)``) in every layer (the attention update loses its part
  along ``resid_pre``).

The model is trained *through* TransformerLens, so the very edit objects of :mod:`tl_directional.edit`
are in the forward pass during training and evaluation, and gradients flow through them into the
parameters. On the bridge lane (TransformerLens >= 4) the model is
``TransformerBridge.boot_transformers`` of a freshly initialised Hugging Face GPT-2 directory and
the gradients land in the wrapped Hugging Face parameters; :func:`export_model` writes them back
out as a plain Hugging Face directory. On the legacy lane (TransformerLens 2.x) it is a
``HookedTransformer`` of the same directory; training works there too, but its unembedding is
untied from the embedding (``HookedTransformer`` keeps separate ``W_E`` / ``W_U``), so the result
is not the same model and exporting to Hugging Face format is bridge-lane only.

One job per module:

* :mod:`.config`: :class:`TrainConfig`, the variants' edits, the learning-rate schedule, run-directory names.
* :mod:`.data`: corpus, tokenizer, token windows, batch order.
* :mod:`.pretokenised`: a pre-tokenised corpus (``studies/data/build_pass_corpus.py``), read in a single pass.
* :mod:`.model`: the seeded initial model, weights under native names, trainable parameters.
* :mod:`.checkpoint`: checkpoint records (write, read, verify, resume checks), metrics CSV.
* :mod:`.trainer`: :class:`Trainer`, :func:`train`, ``torchrun`` set-up and tear-down.
* :mod:`.export`: :func:`export_model`, :func:`evaluate_text`.
* :mod:`.experiment`: every variant x seed, the paired report, pre-edit geometry.
* :mod:`.cli`: the ``train`` and ``experiment`` command lines.

Command line: ``python -m tl_directional.training train --variant vpara --corpus DIR --out RUN``,
``tl-directional train ...`` or ``python -m tl_directional.training train ...``; ``--help`` lists
every setting.
"""

from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    ConfigMismatchError,
    check_resumable,
    checkpoint_paths,
    diff_config,
    read_checkpoint,
    remove_orphan_temporaries,
    write_checkpoint,
    write_metrics_csv,
)
from .config import (
    BUILTIN_CORPUS,
    CHECKPOINT_DIR,
    INIT_DIR,
    METRICS_FILE,
    OPERATIONAL_KEYS,
    SUMMARY_FILE,
    TOKENIZER_DIR,
    VARIANT_SPACES,
    VARIANTS,
    TrainConfig,
    lr_at,
    variant_edits,
)
from .data import (
    Data,
    TokenizerMismatchError,
    batch_indices,
    data_sha256,
    encode_text,
    load_tokenizer,
    make_windows,
    prepare_data,
    tokenizer_sha256,
)
from .experiment import (
    DEFAULT_SEEDS,
    EXPERIMENT_DEFAULTS,
    paired_comparison,
    pre_edit_geometry,
    run_experiment,
    run_name,
    write_report,
)
from .export import check_tokenizer_matches, evaluate_text, export_model
from .model import (
    build_init_dir,
    canonical_state_dict,
    load_canonical_state_dict_,
    load_init,
    trainable_parameters,
)
from .pretokenised import (
    PRETOKENISED_META,
    PretokenisedCorpusError,
    check_single_pass,
    is_pretokenised,
    read_tokens,
    stream_windows,
)
from .trainer import Dist, Trainer, TrainResult, init_distributed, train

__all__ = [
    "BUILTIN_CORPUS",
    "CHECKPOINT_DIR",
    "CHECKPOINT_FORMAT",
    "DEFAULT_SEEDS",
    "EXPERIMENT_DEFAULTS",
    "INIT_DIR",
    "METRICS_FILE",
    "OPERATIONAL_KEYS",
    "PRETOKENISED_META",
    "SUMMARY_FILE",
    "TOKENIZER_DIR",
    "VARIANTS",
    "VARIANT_SPACES",
    "CheckpointError",
    "ConfigMismatchError",
    "PretokenisedCorpusError",
    "Data",
    "Dist",
    "TokenizerMismatchError",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "batch_indices",
    "build_init_dir",
    "canonical_state_dict",
    "check_resumable",
    "check_single_pass",
    "check_tokenizer_matches",
    "checkpoint_paths",
    "data_sha256",
    "diff_config",
    "encode_text",
    "evaluate_text",
    "export_model",
    "init_distributed",
    "is_pretokenised",
    "load_canonical_state_dict_",
    "load_init",
    "load_tokenizer",
    "lr_at",
    "make_windows",
    "paired_comparison",
    "pre_edit_geometry",
    "prepare_data",
    "read_checkpoint",
    "read_tokens",
    "remove_orphan_temporaries",
    "run_experiment",
    "run_name",
    "stream_windows",
    "tokenizer_sha256",
    "train",
    "trainable_parameters",
    "variant_edits",
    "write_checkpoint",
    "write_metrics_csv",
    "write_report",
]
