"""Training with edits active (tl_directional.training): data order, schedule, bit-exact resume,
the edit really in the forward pass (and its gradient), DDP world size 2, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tl_directional as tld
from tl_directional import training as T
from tl_directional.cli.train import train_main
from tl_directional.model.load import train_tokenizer
from tl_directional.training import checkpoint as C

from ._training import TINY, cfg


def weights(model) -> dict[str, torch.Tensor]:
    return T.canonical_state_dict(model)


# -- pure pieces ------------------------------------------------------------------------------


def test_batch_indices_pure_function_covering_each_epoch():
    n, bs = 10, 4
    a = [T.batch_indices(3, s, bs, n) for s in range(5)]
    b = [T.batch_indices(3, s, bs, n) for s in reversed(range(5))][::-1]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    flat = torch.cat(a)
    assert sorted(flat[:10].tolist()) == list(range(10))  # epoch 0 visits every window once
    assert sorted(flat[10:20].tolist()) == list(range(10))
    assert not torch.equal(flat[:10], flat[10:20])  # a new permutation per epoch
    assert not torch.equal(T.batch_indices(4, 0, bs, n), a[0])  # depends on the seed


def test_lr_schedule_warmup_then_cosine():
    c = T.TrainConfig(lr=1.0, warmup_steps=4, max_steps=14, min_lr_ratio=0.1)
    lrs = [T.lr_at(s, c) for s in range(15)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(x >= y for x, y in zip(lrs[3:], lrs[4:], strict=False))
    assert lrs[14] == pytest.approx(0.1)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="variant"):
        T.TrainConfig(variant="v-para")
    with pytest.raises(ValueError, match="divisible"):
        T.TrainConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown TrainConfig keys"):
        T.TrainConfig.from_dict({"lr": 1e-3, "learning_rate": 1e-3})


# -- the edit is in the training forward pass -------------------------------------------------


def _capture_after_edit(trainer, tokens):
    """Loss with the variant's hooks plus read-only hooks that run after them."""
    from tl_directional.model.sites import resolve_sites

    sites = resolve_sites(trainer.model, warn=False)
    got: dict = {}

    def grab(key, layer):
        def hook(t, hook):  # noqa: ARG001
            got[(key, layer)] = t.detach().clone()
            return t
        return hook

    extra = []
    for L in range(sites.n_layers):
        extra += [(sites.value[L].v_hook, grab("v", L)), (sites.value[L].z_hook, grab("z", L))]
        unit = sites.unit("attn", L)
        extra += [(unit.reference_hook, grab("ref", L)), (unit.update_hook, grab("upd", L))]
    trainer.model.train()
    with trainer.model.hooks(fwd_hooks=trainer.hooks + extra):
        loss = trainer.model(tokens, return_type="loss")
    return loss, got, sites


def _value_weight_grads(trainer) -> list[torch.Tensor]:
    grads = []
    for name, p in trainer.named_params:
        if name.endswith(("attn.v._original_component.weight", "attn.W_V")):
            grads.append(p.grad)
    assert grads, [n for n, _ in trainer.named_params]
    return grads


def test_vpara_edit_active_in_training_and_gradients_reach_W_V(tmp_path, tok_dir, data):
    tr = T.Trainer(cfg(tok_dir, variant="vpara"), tmp_path / "v", data=data)
    tokens = tr.batch(0)
    loss, got, sites = _capture_after_edit(tr, tokens)
    for L in range(sites.n_layers):
        z, v = got[("z", L)], got[("v", L)]
        beta = tld.decompose(z, v).alpha  # the edited output, against each token's own value
        assert beta.abs().max() < 1e-5, f"layer {L}: edited hook_z still has a parallel part"
    loss.backward()
    grads = _value_weight_grads(tr)
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    # The edit changes the gradient: the same step without it differs.
    tr.optimizer.zero_grad(set_to_none=True)
    tr.model(tokens, return_type="loss").backward()
    plain = _value_weight_grads(tr)
    assert not torch.allclose(grads[0], plain[0])


def test_unedited_training_output_has_a_parallel_part(tmp_path, tok_dir, data):
    # Control for the test above: without the edit, beta is far from 0.
    tr = T.Trainer(cfg(tok_dir, variant="baseline"), tmp_path / "b", data=data)
    _, got, sites = _capture_after_edit(tr, tr.batch(0))
    z, v = got[("z", 0)], got[("v", 0)]
    assert tld.decompose(z, v).alpha.abs().max() > 1e-2


def test_attn_para_edit_active_in_training(tmp_path, tok_dir, data):
    tr = T.Trainer(cfg(tok_dir, variant="attn-para"), tmp_path / "a", data=data)
    loss, got, sites = _capture_after_edit(tr, tr.batch(0))
    for L in range(sites.n_layers):
        alpha = tld.decompose(got[("upd", L)], got[("ref", L)]).alpha
        assert alpha.abs().max() < 1e-5
    loss.backward()
    assert all(p.grad is not None for _, p in tr.named_params)


# -- resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["vpara"])
def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path, tok_dir, data, variant):
    c = cfg(tok_dir, variant=variant)
    full = T.train(c, tmp_path / "full", progress=False, data=data)
    part = T.train(c, tmp_path / "split", progress=False, data=data, stop_after=3)
    assert part.step == 3 and part.final_val_loss is None
    rest = T.train(c, tmp_path / "split", progress=False, data=data)
    assert rest.resumed_from == 3 and rest.step == 6
    a, b = weights(full.model), weights(rest.model)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from uninterrupted ones"
    assert full.metrics == rest.metrics  # train and validation losses, bit for bit
    # Checkpoints hold the optimiser too: the final ones match tensor for tensor.
    _, ta = T.read_checkpoint(T.checkpoint_paths(tmp_path / "full")[-1])
    _, tb = T.read_checkpoint(T.checkpoint_paths(tmp_path / "split")[-1])
    assert any(k.startswith("optim/") for k in ta)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert len(T.checkpoint_paths(tmp_path / "full")) == c.keep_checkpoints


def test_resume_with_different_config_names_file_and_keys(tmp_path, tok_dir, data):
    T.train(cfg(tok_dir), tmp_path / "r", progress=False, data=data, stop_after=2)
    with pytest.raises(T.ConfigMismatchError) as err:
        T.train(cfg(tok_dir, lr=1e-3, variant="vpara"), tmp_path / "r", progress=False, data=data)
    msg = str(err.value)
    assert "ckpt-0000002.json" in msg and "lr" in msg and "variant" in msg and "--out" in msg
    # cadence settings are not part of the run's identity
    T.train(cfg(tok_dir, ckpt_every=3), tmp_path / "r", progress=False, data=data, stop_after=3)


def test_no_resume_refuses_to_overwrite(tmp_path, tok_dir, data):
    T.train(cfg(tok_dir), tmp_path / "r", progress=False, data=data, stop_after=2)
    with pytest.raises(T.CheckpointError, match="already holds checkpoints"):
        T.train(cfg(tok_dir), tmp_path / "r", progress=False, data=data, resume=False)


def test_truncated_or_corrupt_checkpoint_is_a_clear_error(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    T.train(cfg(tok_dir), run, progress=False, data=data, stop_after=4)
    last = T.checkpoint_paths(run)[-1]
    st = last.with_suffix(".safetensors")
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])  # truncated
    with pytest.raises(T.CheckpointError) as err:
        T.train(cfg(tok_dir), run, progress=False, data=data)
    assert str(st) in str(err.value) and "ckpt-0000002.json" in str(err.value)
    last.write_text('{"format": "tl_dir')  # and a truncated record
    with pytest.raises(T.CheckpointError, match=str(last).replace(".", r"\.")):
        T.train(cfg(tok_dir), run, progress=False, data=data)
    # The fix the message gives works: drop the bad checkpoint, resume from the previous one.
    last.unlink()
    st.unlink()
    assert T.train(cfg(tok_dir), run, progress=False, data=data).resumed_from == 2


def test_failed_checkpoint_write_keeps_the_good_one(tmp_path, tok_dir, data, monkeypatch):
    run = tmp_path / "r"
    T.train(cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    good = T.checkpoint_paths(run)[-1]
    before = good.with_suffix(".safetensors").read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(C, "json_bytes", boom)  # dies after the tensors, before the record
    with pytest.raises(OSError, match="disk full"):
        T.train(cfg(tok_dir), run, progress=False, data=data, stop_after=4)
    monkeypatch.undo()
    assert T.checkpoint_paths(run) == [good]
    assert good.with_suffix(".safetensors").read_bytes() == before
    assert not [p for p in (run / T.CHECKPOINT_DIR).iterdir() if p.name.endswith(".tmp")]
    assert T.train(cfg(tok_dir), run, progress=False, data=data).resumed_from == 2


# -- bad input --------------------------------------------------------------------------------


def test_missing_corpus_names_the_directory_and_the_fix(tmp_path):
    c = T.TrainConfig(corpus=str(tmp_path / "nope"), **TINY)
    with pytest.raises(FileNotFoundError) as err:
        T.prepare_data(c)
    assert str(tmp_path / "nope") in str(err.value) and "studies.data.fetch_corpus" in str(err.value)
    rc = train_main(["--out", str(tmp_path / "run"), "--corpus", str(tmp_path / "nope"), "--quiet"])
    assert rc == 2


def test_tokenizer_larger_than_model_vocab_is_refused(tmp_path, tok_dir):
    with pytest.raises(T.TokenizerMismatchError, match="vocab"):
        T.prepare_data(T.TrainConfig(tokenizer=str(tok_dir), **{**TINY, "vocab_size": 300}))
    with pytest.raises(T.TokenizerMismatchError, match="tokenizer.json"):
        T.prepare_data(T.TrainConfig(tokenizer=str(tmp_path), **TINY))


def test_resume_with_another_tokenizer_is_refused(tmp_path, tok_dir, data):
    run = tmp_path / "r"
    T.train(cfg(tok_dir), run, progress=False, data=data, stop_after=2)
    other = T.Data(data.tokenizer, data.train, data.validation, "0" * 64, {})
    with pytest.raises(T.TokenizerMismatchError, match="ckpt-0000002.json"):
        T.train(cfg(tok_dir), run, progress=False, data=other)


# -- export -----------------------------------------------------------------------------------


def test_export_roundtrip_matches_trained_model(tmp_path, tok_dir, data, lane):
    from tl_directional.model.load import load_hf_model, load_model

    res = T.train(cfg(tok_dir, max_steps=3), tmp_path / "r", progress=False, data=data)
    if lane != "bridge":
        with pytest.raises(NotImplementedError, match="bridge"):
            T.export_model(res.model, data.tokenizer, tmp_path / "exp")
        return
    out = T.export_model(res.model, data.tokenizer, tmp_path / "exp", dtype=torch.float32)
    tokens = data.validation[:2]
    with torch.no_grad():
        trained = res.model.eval()(tokens)
        again = load_model(out)(tokens)
        hf = load_hf_model(out)(tokens).logits
    assert torch.equal(trained, again)
    torch.testing.assert_close(hf, trained, atol=1e-5, rtol=1e-5)
    info = json.loads((out / "tl_directional_build.json").read_text())
    assert info["random_weights"] is False
    # loadable by transformers 4.x (legacy lane) as well as 5.x
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


# -- distributed ------------------------------------------------------------------------------


def test_ddp_world_size_2_with_gloo_matches_single_process(tmp_path, tok_dir, data):
    """torchrun, 2 CPU processes, gloo: each rank takes half of the global batch and DDP averages
    the gradients, so the run follows the single-process one up to reduction order."""
    c = cfg(tok_dir, variant="vpara", max_steps=4, eval_every=2)
    single = T.train(c, tmp_path / "single", progress=False, data=data)
    args = ["--out", str(tmp_path / "ddp"), "--quiet", "--threads", "1"]
    for k, v in c.to_dict().items():
        if v is not None:
            args += ["--" + k.replace("_", "-"), str(v)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(T.__file__).parents[2])}
    # the real entry point (python -m tl_directional.training train), then a look at what is left running
    threads = tmp_path / "threads"
    entry = tmp_path / "entry.py"
    entry.write_text(
        "import json, os, runpy, sys\n"
        "from tl_directional.io.distributed import group_threads_alive\n"
        "try:\n"
        "    runpy.run_module('tl_directional.training', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        f"    open({str(threads)!r} + os.environ['RANK'], 'w').write(json.dumps(group_threads_alive()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(entry), "train", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        # train() destroys the group it created; its threads left running can abort the process
        # at interpreter exit (issue 16)
        left = json.loads(Path(f"{threads}{rank}").read_text())
        assert left in ([], None), f"rank {rank}: process-group threads alive after train: {left}"
    summary = json.loads((tmp_path / "ddp" / T.SUMMARY_FILE).read_text())
    assert summary["world_size"] == 2
    meta, tensors = T.read_checkpoint(T.checkpoint_paths(tmp_path / "ddp")[-1])
    ddp_curve = [m["val_loss"] for m in meta["metrics"]]
    single_curve = [m["val_loss"] for m in single.metrics]
    assert ddp_curve == pytest.approx(single_curve, rel=1e-4)
    ref = weights(single.model)
    for k, v in ref.items():
        torch.testing.assert_close(tensors[f"model/{k}"], v, atol=1e-4, rtol=1e-3)


def test_model_and_tokenizer_that_do_not_belong_together(tiny_model, data):
    model = tiny_model("gpt2")  # vocabulary 512
    T.check_tokenizer_matches(model, data.tokenizer, "ok")  # 512 tokens fit
    big = train_tokenizer(["In the beginning God created the heaven and the earth."] * 50 +
                          [chr(0x4e00 + i) * 3 for i in range(600)], 1024)
    with pytest.raises(T.TokenizerMismatchError, match="my-model-dir"):
        T.check_tokenizer_matches(model, big, "my-model-dir")


# -- the variants' edits come from the edit-space registry ------------------------------------


def test_variant_edits_are_the_registry_spaces_at_s_par_0():
    from tl_directional.edit import ResidualScale, ValueScale

    assert T.variant_edits("baseline") == []
    (v,) = T.variant_edits("vpara")
    assert type(v) is ValueScale and vars(v) == vars(ValueScale(s_par=0.0, mode="full"))
    (a,) = T.variant_edits("attn-para")
    assert type(a) is ResidualScale and vars(a) == vars(ResidualScale("attn", s_par=0.0))
    with pytest.raises(ValueError, match=r"variant must be one of .*'value'"):
        T.variant_edits("value")


def test_package_entry_point_names_its_commands(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(T.__file__).parents[2])}
    r = subprocess.run([sys.executable, "-m", "tl_directional.training", "fit"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be one of train, experiment, got 'fit'" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "tl_directional.training", "train", "--help"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tl-directional train" in r.stdout and "--variant" in r.stdout
