"""BERT (``BertForMaskedLM``): post-LN encoder with an MLM head. Its tiny tokenizer adds the
mask token ``<|mask|>`` (id 1). Split on the bridge only: the legacy lane loads it as a
``HookedEncoder``, whose post-LN sites tl_directional does not resolve."""

import torch

from ._base import HF_SHAPE, Family, Layout, shape_fields


def legacy_config(c):
    return {
        **shape_fields(c, d_head=c.hidden_size // c.num_attention_heads, eps=c.layer_norm_eps, act_fn="gelu"),
        "attention_dir": "bidirectional",
    }


class _Namespace:
    """Attribute bag used to hand TL's BERT converter the sub-modules it reads."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def bert_for_converter(hf_model):
    """``BertForMaskedLM`` dressed up as the ``BertForPreTraining`` TL's converter expects.

    ``convert_bert_weights`` also reads a pooler and an NSP head, which a masked-LM model does not
    have; zero-valued stand-ins fill those slots (they never touch the MLM logits).
    """
    from transformers.models.bert.modeling_bert import BertPooler

    d_model = hf_model.config.hidden_size
    pooler = getattr(hf_model.bert, "pooler", None)
    if pooler is None:
        pooler = BertPooler(hf_model.config)
        torch.nn.init.zeros_(pooler.dense.weight)
        torch.nn.init.zeros_(pooler.dense.bias)
    nsp = torch.nn.Linear(d_model, 2)
    torch.nn.init.zeros_(nsp.weight)
    torch.nn.init.zeros_(nsp.bias)
    bert = _Namespace(embeddings=hf_model.bert.embeddings, encoder=hf_model.bert.encoder, pooler=pooler)
    cls = _Namespace(predictions=hf_model.cls.predictions, seq_relationship=nsp)
    return _Namespace(bert=bert, cls=cls)


def convert(hf_model, cfg):
    from transformer_lens.pretrained.weight_conversions import convert_bert_weights

    return convert_bert_weights(bert_for_converter(hf_model), cfg)


FAMILY = Family(
    name="bert",
    hf_class="BertForMaskedLM",
    model_types=("bert",),
    config_class="BertConfig",
    config_names=HF_SHAPE,
    config_fixed=dict(hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      classifier_dropout=0.0, layer_norm_eps=1e-12, type_vocab_size=2,
                      tie_word_embeddings=True),
    tokenizer_specials=("<|mask|>",),
    layout=Layout(norm="post-LN", norm_gain="LN", positions="learned"),
    legacy_config=legacy_config,
    legacy_converter=convert,
    legacy_encoder=True,
    causal=False,
    notes=("Legacy lane: loads as a HookedEncoder, which tl_directional does not split (post-LN "
           "sites are resolved on the bridge only).",),
)
