"""Smoke test of the benchmark harness (``python -m benchmarks.run``).

Runs ``--quick`` on the tiny seeded GPT-2 of the shared fixtures and checks the JSON schema:
every contract record name is present with its fields, available records carry finite
positive ratios and a ci95 around them. It checks the harness, not speed: no timing
assertions.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import run as bench_run  # noqa: E402
from benchmarks.memory_model import COMMITTED_POINTS as MEMORY_POINTS  # noqa: E402
from benchmarks.registry import STATUSES  # noqa: E402
from benchmarks.timing import median_ci, paired_timing  # noqa: E402

CONTRACT = {
    "profile_overhead": 1.00,
    "profile_vs_handwritten": 0.90,
    "peer_nnsight": 0.80,
    "profile_vs_cache": 1.0,
    "edit_overhead": 1.03,
    "sweep_cost": 1.05,
    "sweep_shared_prefix": 0.80,
    "train_step_overhead": 1.10,
    "compression_local_cost": 2.0,
    "layer_sweep_shared_prefix": 0.60,
    "patching_vs_transformer_lens": 0.20,
}
ALWAYS_AVAILABLE = ("profile_overhead", "profile_vs_handwritten", "profile_vs_cache",
                    "edit_overhead", "edit_exclusive_overhead", "sweep_shared_prefix", "layer_sweep_shared_prefix",
                    "patching_vs_transformer_lens")
VERDICTS = ("met", "missed", "too noisy")
RECORD_FIELDS = ("name", "setting", "primary", "status", "reason", "target", "target_op", "met",
                 "ratio", "ci95", "n_pairs", "times", "extra", "baseline", "candidate")
MACHINE_FIELDS = ("cpu_count", "cpu_capability", "kernel_env", "torch_version", "transformer_lens_version", "device", "dtype",
                  "git_commit")


@pytest.fixture(scope="module")
def quick_json(tiny_model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    code = bench_run.main(["--quick", "--json", str(out), "--model", str(tiny_model_dir("gpt2"))])
    assert code == 0, "a record errored; see the traceback on stderr"
    return json.loads(out.read_text())


def test_header_has_machine_info(quick_json):
    assert quick_json["schema_version"] == bench_run.SCHEMA_VERSION
    assert quick_json["mode"] == "quick"
    for key in MACHINE_FIELDS:
        assert key in quick_json["machine"], key
    assert quick_json["machine"]["device"] == "cpu"
    assert quick_json["machine"]["dtype"] == "float32"
    assert quick_json["model"]["d_model"] == 32


def test_every_contract_record_present_with_fields(quick_json):
    recs = quick_json["records"]
    names = {r["name"] for r in recs}
    assert set(CONTRACT) <= names
    assert set(CONTRACT) <= set(quick_json["summary"])
    for r in recs:
        for key in RECORD_FIELDS:
            assert key in r, (r["name"], key)
        assert r["status"] in STATUSES
        assert r["target"] == CONTRACT.get(r["name"], r["target"])
        assert r["target_op"] in ("<=", "<")
        if r["status"] != "ok":
            assert r["reason"], r["name"]
            assert r["ratio"] is None


def test_available_records_have_finite_positive_ratios(quick_json):
    ok = [r for r in quick_json["records"] if r["status"] == "ok"]
    assert {r["name"] for r in ok} >= set(ALWAYS_AVAILABLE)
    for r in ok:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r["name"]
        lo, hi = r["ci95"]
        assert 0 < lo <= r["ratio"] <= hi, r["name"]
        assert isinstance(r["met"], bool)
        assert r["verdict"] in VERDICTS, r["name"]
        t = r["times"]
        assert len(t["baseline_s"]) == len(t["candidate_s"]) == r["n_pairs"] >= 2
        assert all(x > 0 for x in t["baseline_s"] + t["candidate_s"])


def test_records_checked_what_they_timed(quick_json):
    by = {r["name"]: r for r in quick_json["records"] if r["primary"]}
    extra = by["profile_overhead"]["extra"]
    assert extra["check_tokens_seen_equals_batch_tokens"] is True
    assert extra["verify_over_forward"]["ratio"] > 0
    assert by["profile_vs_cache"]["extra"]["check_max_abs_diff_streaming_vs_cache"] < 1e-4
    assert by["profile_vs_cache"]["extra"]["memory"]["status"] == "skipped"
    assert by["edit_overhead"]["extra"]["check_edit_changes_logits_max_abs"] > 0
    assert by["edit_exclusive_overhead"]["extra"]["check_edit_changes_logits_max_abs"] > 0
    if by["sweep_cost"]["status"] == "ok":  # baseline row + K settings
        assert by["sweep_cost"]["extra"]["check_result_rows"] == by["sweep_cost"]["extra"]["k_settings"] + 1
    assert by["profile_overhead"]["extra"]["tokenize_over_forward"]["ratio"] > 0
    assert by["profile_vs_handwritten"]["extra"]["check_par_frac_mean_diff_vs_hand"] < 1e-4
    prefix = by["sweep_shared_prefix"]["extra"]
    assert prefix["check_max_abs_delta_loss_diff"] < 1e-4 and prefix["first_edited_layer"] >= 1
    peer = by["peer_nnsight"]
    if peer["status"] == "ok":  # nnsight installed (or BENCH_NNSIGHT_PYTHON set)
        assert peer["extra"]["check_par_frac_mean_diff"] < 1e-4
    else:
        assert peer["status"] == "skipped" and "nnsight" in peer["reason"]
    if by["compression_local_cost"]["status"] == "ok":
        assert by["compression_local_cost"]["extra"]["check_rows"] > 0
    layers = by["layer_sweep_shared_prefix"]["extra"]  # every layer's setting from its own block
    assert layers["check_max_abs_delta_loss_diff"] < 1e-4 and layers["check_result_rows"] == layers["n_layers"] + 1
    patch = by["patching_vs_transformer_lens"]["extra"]
    assert patch["check_max_abs_diff_vs_transformer_lens"] <= 1e-5
    assert patch["patched_runs"] == patch["n_layers"] * patch["prompt_tokens"]
    assert set(patch["variants_timed_once"]) == {"par", "perp"}


def test_slow_records_run_on_the_primary_setting_only():
    from benchmarks.registry import REGISTRY

    assert REGISTRY["patching_vs_transformer_lens"].primary_only
    assert not REGISTRY["profile_overhead"].primary_only


def test_default_mode_scales_sequence_length_and_batch():
    cfg = bench_run.make_config(bench_run.parse_args([]))
    main = [s for s in cfg.settings if s.model == "main"]
    assert len({s.seq for s in main}) >= 2 and len({s.batch for s in main}) >= 2
    assert sum(s.primary for s in cfg.settings) == 1
    assert cfg.memory and cfg.min_pairs >= 10


def test_cuda_mode_skips_cleanly_without_gpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert bench_run.main(["--device", "cuda", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["machine"]["dtype"] == "bfloat16"
    assert {r["name"] for r in doc["records"]} >= set(CONTRACT)
    assert all(r["status"] == "skipped" for r in doc["records"])


@pytest.mark.parametrize("mode", ["streaming", "handwritten"])
def test_memory_worker_reports_a_peak_increment(tiny_model_dir, mode):
    from benchmarks.memory import run_worker

    r = run_worker(str(tiny_model_dir("gpt2")), mode, n_seq=4, seq=16, batch_size=2)
    assert r["tokens_seen"] == 64
    assert r["peak_increment_mb"] >= 0 and r["peak_mb"] >= r["baseline_mb"]


def test_verdict_says_too_noisy_instead_of_guessing():
    from benchmarks.registry import REGISTRY, verdict

    spec = REGISTRY["profile_overhead"]  # <= 1.00, precision 0.05
    assert verdict(spec, 0.97, 0.95, 0.99) == "met"
    assert verdict(spec, 1.10, 1.06, 1.14) == "missed"
    assert verdict(spec, 0.99, 0.80, 1.30) == "too noisy"


def test_timing_statistics():
    med, (lo, hi) = median_ci([1.0, 2.0, 3.0, 4.0, 5.0], seed=0)
    assert med == 3.0 and 1.0 <= lo <= med <= hi <= 5.0
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0], seed=0) == (med, (lo, hi))  # seeded
    calls: list[str] = []
    t = paired_timing(lambda: calls.append("b"), lambda: calls.append("c"), warmup=1,
                      min_pairs=3, max_pairs=3, max_seconds=60)
    assert t.n_pairs == 3 and t.warmup_pairs == 1
    # warm-up b,c; then pairs alternate: b,c / c,b / b,c
    assert calls == ["b", "c", "b", "c", "c", "b", "b", "c"]


def test_catalogue_names_configure_a_real_model_run():
    """``--model smollm2-135m`` / ``gemma-3-270m``: the catalogue name is kept (model-dependent
    targets), there is no wide setting (the JSON says why), peak memory is on, memory scaling off."""
    for name in ("smollm2-135m", "gemma-3-270m"):
        cfg = bench_run.make_config(bench_run.parse_args(["--model", name]))
        assert cfg.catalogue_model == name and cfg.model == name
        assert [s.label for s in cfg.settings] == ["seq=128,batch=8", "seq=32,batch=8", "seq=128,batch=2"]
        assert all(s.model == "main" for s in cfg.settings) and cfg.wide_note and "wide" in cfg.wide_note
        assert cfg.peak_memory and not cfg.memory and cfg.scaled_baselines
        assert cfg.real_floor_pairs == bench_run.REAL_FLOOR_PAIRS
    cfg = bench_run.make_config(bench_run.parse_args([]))
    assert cfg.catalogue_model is None and not cfg.peak_memory and not cfg.scaled_baselines
    assert any(s.model == "wide" for s in cfg.settings)


def test_unknown_model_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_run.make_config(bench_run.parse_args(["--model", "smollm2"]))
    assert exc.value.code == 2
    assert "smollm2-135m" in capsys.readouterr().err  # the closest catalogue name is suggested


def test_model_dependent_targets_are_the_ones_used():
    from benchmarks.registry import REGISTRY, Setting, make_record

    spec = REGISTRY["profile_overhead"]
    primary, other = Setting(128, 8, primary=True), Setting(32, 8)
    assert spec.target_for("smollm2-135m", primary) == (0.90, "smollm2-135m at the primary setting")
    assert spec.target_for("gemma-3-270m", primary)[0] == 1.00
    assert spec.target_for("smollm2-135m", other) == (1.00, "default")
    assert spec.target_for(None, primary) == (1.00, "default")
    rec = make_record(spec.for_target(0.90), primary, status="not_available", reason="x",
                      target_source="smollm2-135m at the primary setting")
    assert rec["target"] == 0.90 and rec["target_source"].startswith("smollm2-135m")
    assert REGISTRY["profile_overhead"].target == 1.00  # the registered spec is unchanged


def test_a_record_a_model_cannot_run_is_not_available(tiny_model_dir):
    """A record asked for on a model it cannot run gives ``not_available`` with the reason (and
    the target), never an error hiding the other records."""
    from benchmarks.registry import REGISTRY

    cfg = bench_run.make_config(bench_run.parse_args(
        ["--quick", "--model", str(tiny_model_dir("gpt2")), "--records", "train_step_overhead"]))
    cfg.catalogue_model = "smollm2-135m"  # as a --model smollm2-135m run sets it
    harness = bench_run.Harness(cfg, log=lambda msg: None)
    try:
        (rec,) = harness.run_spec(REGISTRY["train_step_overhead"])
    finally:
        harness.close()
    assert rec["status"] == "not_available" and "smollm2-135m" in rec["reason"]
    assert rec["target"] == 1.10 and rec["ratio"] is None


@pytest.mark.parametrize(("family", "layout"), [("gpt2", "gpt2"), ("llama", "llama"),
                                                ("gemma3", "gemma3"), ("neox", None)])
def test_peer_layout_of_each_family(tiny_model_dir, family, layout):
    """The nnsight peer knows GPT-2, Llama-style (pre-norm) and Gemma-3 (sandwich norms)
    modules; any other layout is reported (``not_available``), never guessed."""
    from benchmarks.peers import PeerLayoutError, layout_of_dir

    if layout is None:
        with pytest.raises(PeerLayoutError, match="GPTNeoXForCausalLM"):
            layout_of_dir(tiny_model_dir(family))
    else:
        assert layout_of_dir(tiny_model_dir(family)) == layout


def test_peer_model_directory_of_catalogue_names():
    """The peer resolves a catalogue name through the library's own catalogue (the converted
    cache entry), not a hard-coded path."""
    from benchmarks.peers import _hf_dir
    from tl_directional.model.load import catalog, default_model_dir

    assert _hf_dir("default") == default_model_dir()
    for name in catalog.REAL_MODELS:
        if not catalog.verify_entry(catalog.entry_dir(name))[0]:
            continue  # not converted here: resolving would convert it (minutes)
        assert _hf_dir(name) == catalog.entry_dir(name)


def test_peak_memory_probe_of_both_sides(tiny_model_dir):
    """Peak memory beside a record: one fresh subprocess per side, each measured once."""
    from benchmarks.peak_measure import peak_memory
    from benchmarks.registry import REGISTRY

    out = peak_memory(REGISTRY["sweep_cost"], str(tiny_model_dir("gpt2")), 16, 2, device="cpu",
                      dtype="float32", threads=1)
    assert out["status"] == "ok" and "subprocess" in out["method"]
    for side in ("baseline", "candidate"):
        r = out[side]
        assert r["side"] == side and r["peak_mb"] >= r["before_mb"] > 0 and r["increment_mb"] >= 0
    assert "identical sequential" in out["baseline"]["note"]  # one of the 9 forwards


def test_live_peak_counts_the_tensors_alive_at_once():
    """Issue 51: the live count (``BENCH_PEAK_COUNT=live``) is the high-water mark of the bytes
    torch's CPU allocator holds for tensors during the call: 1 MiB and 2 MiB alive together, the
    first freed before 0.5 MiB more, is 3 MiB exactly, whatever glibc keeps resident."""
    import torch

    from benchmarks.peak_measure import live_peak_of, run_probe

    def fn():
        a = torch.empty(2**18)
        b = torch.empty(2**19)
        del a
        return b, torch.empty(2**17)

    r = live_peak_of(fn)
    assert r["increment_mb"] == 3.0 and r["allocations"] == 3 and r["count"] == "live"
    with pytest.raises(ValueError, match=r"count='vmrss' is not a peak count; choose from \('rss', 'live'\)"):
        run_probe("sweep_cost", "unused", 16, 2, "baseline", device="cpu", dtype="float32", threads=1,
                  count="vmrss")


def test_peak_memory_probe_counts_live_tensors(tiny_model_dir):
    """The probe's live count in a fresh subprocess: a forward of the tiny GPT-2 holds at least
    its logits (2 x 16 tokens x the vocabulary, float32) at its peak."""
    from benchmarks.peak_measure import run_probe

    path = tiny_model_dir("gpt2")
    r = run_probe("sweep_cost", str(path), 16, 2, "baseline", device="cpu", dtype="float32", threads=1,
                  count="live")
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    assert r["count"] == "live" and r["increment_mb"] * 2**20 >= 2 * 16 * vocab * 4


def test_scaled_baseline_counts_one_call_k_times():
    import time

    t = paired_timing(lambda: time.sleep(0.01), lambda: None, warmup=0, min_pairs=2, max_pairs=2,
                      max_seconds=60, baseline_scale=9.0)
    assert t.n_pairs == 2 and all(b >= 0.09 for b in t.baseline_s)


def test_scaled_baselines_count_as_many_forwards_as_the_baseline_runs():
    # on a real model a k-forward baseline is timed once and counted `repeat` times: `repeat`
    # must be the k of the record's own base() (layer_sweep_shared_prefix once counted 9 of 31)
    import ast
    import inspect

    import benchmarks.planned as planned

    tree = ast.parse(inspect.getsource(planned))
    checked = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        base = next((n for n in fn.body if isinstance(n, ast.FunctionDef) and n.name == "base"), None)
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "measure"]
        repeat = [k.value for c in calls for k in c.keywords if k.arg == "repeat"]
        if base is None or not repeat:
            continue
        loop = next(n for n in base.body if isinstance(n, ast.For))
        assert ast.dump(loop.iter.args[0]) == ast.dump(repeat[0]), fn.name
        checked.append(fn.name)
    assert {"sweep_cost", "sweep_shared_prefix", "layer_sweep_shared_prefix"} <= set(checked)


def test_scaling_family_runs_each_size_and_dtype_in_its_own_process(tmp_path):
    """``python -m benchmarks.scaling`` (issue 51's scaling family and device script) on the
    suite's tiny size: one harness run per dtype, the records measured (directional and path
    patching against TransformerLens's helpers among them), the built model's stored parameters
    equal to the shape's count, bfloat16 checked against TransformerLens in bfloat16's own
    round-off. TransformerLens 2.18 (the legacy lane) has no ``get_act_patch_direct_path``: there
    the path-patching record says ``not_available``."""
    import importlib

    from benchmarks import scaling, scaling_table

    out = tmp_path / "scaling.json"
    names = ("edit_overhead", "edit_exclusive_overhead", "patching_vs_transformer_lens",
             "path_patching_vs_transformer_lens")
    # 8-token sequences: the patching records patch an 8-token prompt (min(15, seq))
    status = scaling.main(["--sizes", "tiny", "--dtypes", "float32,bfloat16", "--device", "cpu",
                           "--records", ",".join(names),
                           "--setting", "8x1", "--min-pairs", "2", "--max-pairs", "2",
                           "--workdir", str(tmp_path / "models"), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert status == 0, doc
    assert doc["complete"] is True
    assert [(r["size"], r["dtype"]) for r in doc["runs"]] == [("tiny", "float32"), ("tiny", "bfloat16")]
    direct_path = hasattr(importlib.import_module("transformer_lens.patching"), "get_act_patch_direct_path")
    for run in doc["runs"]:
        assert run["parameters"] == scaling.SIZES["tiny"].parameters() == run["parameters_published_shape"]
        records = {r["name"]: r for r in run["run"]["records"]}
        assert set(records) == set(names)
        if not direct_path:
            assert records.pop("path_patching_vs_transformer_lens")["status"] == "not_available"
        assert all(r["status"] == "ok" and r["ratio"] > 0 for r in records.values()), records
        assert all(r["extra"]["check_max_abs_diff_vs_transformer_lens"] >= 0 for n, r in records.items()
                   if not n.startswith("edit"))
        assert records["patching_vs_transformer_lens"]["extra"]["prompt_tokens"] == 8
        # the exclude-self edit is the one timed, and it moves the logits
        excl = records["edit_exclusive_overhead"]["extra"]
        assert "mode='exclusive'" in excl["edit"] and excl["check_edit_changes_logits_max_abs"] > 0
        assert run["run"]["config"]["dtype"] == run["dtype"]
    # the page's merged table: one row per size, one column per record and workload
    text = scaling_table.merged([doc])
    # a ratio row per dtype, and a cost row per dtype for the two patching records' checks
    assert all(f"{n} (8x1)" in text for n in names) and text.count("| tiny |") == 4
    assert scaling.main(["--sizes", "huge", "--json", str(out)]) == 2


def test_scaling_corpus_memory_records_each_multiplier_and_skips_what_would_not_fit(tmp_path, monkeypatch):
    """``python -m benchmarks.scaling --records none --corpus-memory naive`` (issue 51: does the
    streaming profile's peak stay flat with the corpus while ``run_with_cache`` grows, at every
    size) on the tiny size: one worker per (side, multiplier), the increments listed per
    multiplier, each point's memory-model prediction beside it, and a comparison point the model
    predicts would not fit in the RAM the driver sees skipped with the reason in the JSON (here
    the RAM is made small: the naive cache of 64 batches, predicted about 18 MB, over a 10 MB
    budget; the streaming profile's one batch, about 6 MB, under it), never silently."""
    from benchmarks import memory_model, scaling, scaling_table

    # 0.7 x (10 / 0.7) MB = 10 MB of predicted need allowed at the default headroom
    monkeypatch.setattr(scaling, "available_ram_bytes", lambda: int(10 * 2**20 / scaling.MEMORY_HEADROOM))
    out = tmp_path / "corpus.json"
    status = scaling.main(["--sizes", "tiny", "--dtypes", "float32", "--records", "none",
                           "--corpus-memory", "naive", "--memory-setting", "16x2", "--multipliers", "1,64",
                           "--workdir", str(tmp_path / "models"), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert status == 0, doc
    (run,) = doc["runs"]
    assert run["run"]["status"] == "skipped"  # no timed record asked for
    mem = run["corpus_memory"]
    assert mem["status"] == "ok" and mem["compared_with"] == "naive"
    assert mem["multipliers"] == [1, 64] and mem["n_sequences"] == [2, 128]
    s_mb, n_mb = mem["streaming_peak_increment_mb"], mem["naive_peak_increment_mb"]
    assert len(s_mb) == 2 and all(v > 0 for v in s_mb)
    assert n_mb[0] > 0 and n_mb[1] is None
    (skip,) = mem["skipped"]
    assert (skip["mode"], skip["multiplier"], skip["n_sequences"]) == ("naive", 64, 128)
    assert skip["reason"].startswith("predicted ") and "MemAvailable" in skip["reason"]
    assert mem["failed"] == []  # a worker past --worker-timeout would be listed here, the others kept
    assert mem["streaming_growth"] == pytest.approx(s_mb[1] / s_mb[0])
    assert mem["growth_multipliers"] == {"streaming": [1, 64], "naive": [1]}
    assert mem["naive_growth"] is None and isinstance(mem["met"], bool)
    assert {r["multiplier"] for r in mem["runs"] if r["mode"] == "streaming"} == {1, 64}
    assert [r["tokens_seen"] for r in mem["runs"]] == [32, 128 * 16, 32]  # every token of the corpus
    # the predictions: the streaming side grows by its exact-quantile values alone (those of the
    # batches before the last, under 16,384 tokens a group), the naive cache with the corpus
    shape = scaling.SIZES["tiny"].shape
    pred = mem["predicted_mb"]
    grown = memory_model.estimate(shape, "profile", 2, 16, "float32", tokens=2048)
    assert pred["streaming"][1] * 2**20 == pytest.approx(grown["total"])
    assert (pred["streaming"][1] - pred["streaming"][0]) * 2**20 >= memory_model.kept_bytes_per_token(shape) * (2048 - 32)
    assert pred["naive"][1] == pytest.approx(
        memory_model.estimate(shape, "cache_split", 128, 16, "float32")["total"] / 2**20)
    assert pred["naive"][1] > 10 > pred["streaming"][1]
    assert [c["mode"] for c in mem["ram_checks"]] == ["streaming", "naive", "streaming", "naive"]
    text = scaling_table.corpus_memory_table([doc])
    assert "| tiny | float32 |" in text and "skipped: predicted" in text


def test_corpus_memory_keeps_the_other_points_when_one_worker_times_out(monkeypatch):
    """A corpus-memory point whose worker runs past its timeout (a long corpus on a large build)
    is listed in ``failed`` with the reason; the points measured before and after it are kept
    (the first long run lost its 1x and 64x points to one 128x timeout). The worker is replaced
    by a stand-in here: what is checked is the bookkeeping, not a measurement."""
    import subprocess

    from benchmarks import memory

    counts = set()

    def worker(source, mode, n_seq, seq, batch, *args, timeout=900, count="rss"):
        counts.add(count)
        if mode == "naive" and n_seq == 8:
            raise subprocess.TimeoutExpired(["benchmarks.memory"], timeout)
        return {"peak_increment_mb": float(n_seq if mode == "naive" else 1), "method": "m", "allocator": "a"}

    monkeypatch.setattr(memory, "run_worker", worker)
    mem = memory.memory_scaling("unused", seq=4, batch_size=2, multipliers=(1, 4, 16), log=lambda m: None,
                                skip=lambda mode, m: None, timeout=5, count="live")
    assert counts == {"live"} and mem["count"] == "live"  # every worker counts what the run asked for
    assert mem["naive_peak_increment_mb"] == [2.0, None, 32.0]
    assert mem["streaming_peak_increment_mb"] == [1.0, 1.0, 1.0] and mem["met"] is True
    (f,) = mem["failed"]
    assert (f["mode"], f["multiplier"]) == ("naive", 4) and f["reason"].startswith("TimeoutExpired")
    assert mem["naive_growth"] == 16.0 and mem["growth_multipliers"]["naive"] == [1, 16]
    with pytest.raises(subprocess.TimeoutExpired):  # the harness's way (no skip): raised, as before
        memory.memory_scaling("unused", seq=4, batch_size=2, multipliers=(1, 4), log=lambda m: None)


def test_the_corpus_worker_counts_live_tensor_bytes_when_asked():
    """``run_worker(..., count="live")``: the worker's increment is the live tensor bytes'
    high-water mark (``benchmarks.memory.live_peak_of``), said in the result; the streaming
    profile of 8 x 32 tokens holds some, and VmHWM's reading of the same call is another number.
    A count that is neither is refused before any worker starts."""
    from benchmarks import memory
    from benchmarks.memory import METHOD_LIVE

    live = memory.run_worker("default", "streaming", 8, 32, 4, count="live", timeout=600)
    assert live["count"] == "live" and live["method"] == METHOD_LIVE and live["baseline_mb"] == 0.0
    assert live["tokens_seen"] == 8 * 32 and 0.5 < live["peak_increment_mb"] < 100
    rss = memory.run_worker("default", "streaming", 8, 32, 4, timeout=600)
    assert rss["method"].startswith("VmHWM") and "count" not in rss
    with pytest.raises(ValueError, match="count='vmhwm'"):
        memory.run_worker("default", "streaming", 8, 32, 4, count="vmhwm")
    with pytest.raises(ValueError, match="device='cuda'"):  # not ignored on a device it cannot count
        memory.run_worker("default", "streaming", 8, 32, 4, device="cuda", count="live")
    from benchmarks.scaling import main as scaling_main

    assert scaling_main(["--sizes", "tiny", "--records", "none", "--corpus-memory", "naive",
                         "--corpus-count", "live", "--device", "cuda", "--json", "unused.json"]) == 2


def test_the_late_sender_path_record_patches_the_last_layers_on_both_sides(tmp_path):
    """``path_patching_late_sender_vs_transformer_lens`` (the scaling family's reduced path
    patching workload) on a 4-layer seeded Llama: the sender is head 0 of layer ``4 - 1 -
    LATE_RECEIVER_LAYERS`` on both sides, its receivers the last layer's heads only, each checked
    equal to ``get_act_patch_direct_path`` from that layer; the layer-0 record, the same body,
    patches every later head. ``not_available`` on TransformerLens 2.18 (the legacy lane)."""
    import importlib

    from benchmarks.path_patching import LATE_RECEIVER_LAYERS
    from tl_directional.model.load import build_tiny_hf_model

    model_dir = build_tiny_hf_model("llama", tmp_path / "llama4", seed=0, n_layers=4, d_model=32, n_heads=4,
                                    n_kv_heads=2)
    out = tmp_path / "late.json"
    names = ("path_patching_vs_transformer_lens", "path_patching_late_sender_vs_transformer_lens")
    code = bench_run.main(["--model", str(model_dir), "--records", ",".join(names), "--setting", "8x1",
                           "--min-pairs", "2", "--max-pairs", "2", "--no-memory", "--no-wide",
                           "--no-peak-memory", "--json", str(out)])
    assert code == 0
    records = {r["name"]: r for r in json.loads(out.read_text())["records"]}
    assert set(records) == set(names)
    if not hasattr(importlib.import_module("transformer_lens.patching"), "get_act_patch_direct_path"):
        assert {r["status"] for r in records.values()} == {"not_available"}
        return
    assert all(r["status"] == "ok" and r["ratio"] > 0 for r in records.values()), records
    full = records["path_patching_vs_transformer_lens"]["extra"]
    late = records["path_patching_late_sender_vs_transformer_lens"]["extra"]
    assert LATE_RECEIVER_LAYERS == 1
    assert (full["sender_layer"], full["receivers"]) == (0, 3 * 4)
    assert (late["sender_layer"], late["receivers"]) == (2, 1 * 4)
    assert late["check_max_abs_diff_vs_transformer_lens"] >= 0
    assert "n_layers - 2" in records["path_patching_late_sender_vs_transformer_lens"]["baseline"]


@pytest.mark.parametrize("text", ["64", "0x1", "64x0", "axb"])
def test_a_bad_setting_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_run.make_config(bench_run.parse_args(["--setting", text]))
    assert exc.value.code == 2
    assert "--setting" in capsys.readouterr().err


def test_one_setting_replaces_the_default_workloads():
    config = bench_run.make_config(bench_run.parse_args(["--setting", "64x2"]))
    assert [(s.seq, s.batch, s.primary) for s in config.settings] == [(64, 2, True)]


# ---------------------------------------------------------------------------------------------
# the memory model (benchmarks/memory_model.py, issue 51)
# ---------------------------------------------------------------------------------------------


def test_memory_model_arithmetic_on_constructed_shapes():
    """Each term is the tensor size it names: logits ``T V e``, the graph linear in the layers a
    pass keeps, bfloat16 half of float32 except the profile's rows (fitted per dtype), and directional
    patching's stacked copies as the library sizes them."""
    from benchmarks import memory_model
    from benchmarks.memory_model import MB, PROFILE_BYTES, PROFILE_BYTES_RSS, Shape, estimate
    from tl_directional.evaluate.patching.generic import copies_per_forward

    s = Shape(n_layers=8, d_model=64, n_heads=4, n_kv_heads=2, d_mlp=256, vocab=1000)
    f = estimate(Shape(8, 64, 4, 2, 256, 10_000), "forward", 2, 16, "float32", fixed=False)
    assert f["logits"] == 2 * 16 * 10_000 * 4 and f["final_stream"] == 2 * 2 * 16 * 64 * 4
    assert f["total"] == f["logits"] + f["final_stream"]
    # a small vocabulary: the peak is a block's working set instead
    small = estimate(Shape(8, 64, 4, 2, 256, 10), "forward", 2, 16, "float32", fixed=False)
    assert small["total"] == small["block"] == 2 * 16 * (3 * 256 + 4 * 64) * 4 + 2 * 2 * 4 * 16 * 16 * 4
    assert estimate(Shape(8, 64, 4, 2, 256, 10_000), "forward", 2, 16, "bfloat16", fixed=False)["total"] * 2 == f["total"]
    one = estimate(s, "attribution", 4, 16, fixed=False)
    two = estimate(s, "attribution", 4, 16, layers_per_pass=2, fixed=False)
    assert one["graph"] == 4 * 16 * 8 * (3 * 256 + 5 * 64 + 4 * 16) * 4
    assert two["graph"] * 4 == one["graph"] and two["clean"] == one["clean"]
    # bfloat16: the norms' float32 inputs and the softmax's float32 probabilities stay 4 bytes
    assert estimate(s, "attribution", 4, 16, "bfloat16", fixed=False)["graph"] == 4 * 16 * 8 * (
        (3 * 256 + 3 * 64 + 4 * 16) * 2 + (2 * 64 + 4 * 16) * 4)
    # a wide stream with many heads, one block per pass: the head nodes' float64 scoring is the peak
    wide = estimate(Shape(4, 2048, 32, 8, 8192, 1000), "attribution", 4, 16, "bfloat16", layers_per_pass=1,
                    fixed=False)
    assert set(wide) == {"clean", "pass_acts", "pass_grads", "head_float64", "total"}
    assert wide["head_float64"] == (2048**2 + 2 * 64 * 32 * 2048 + 4 * 64 * 2048) * 8
    assert estimate(s, "attribution", 4, 16, node_types=("resid",), fixed=False)["clean"] == 8 * 4 * 16 * 64 * 4
    prof = estimate(s, "profile", 2, 16, "bfloat16", fixed=False)
    f32 = estimate(s, "profile", 2, 16, "float32", fixed=False)["layers_rows"]
    # the profile's rows per layer and token: fitted bytes per d_model and per n_heads x seq
    for dtype, rows in (("float32", f32), ("bfloat16", prof["layers_rows"])):
        a, b = PROFILE_BYTES[dtype]
        assert rows == pytest.approx(8 * 2 * 16 * (a * 64 + b * 4 * 16), rel=1e-12)
    a, b = PROFILE_BYTES_RSS["float32"]  # VmHWM's fit, with the first-call term
    assert estimate(s, "profile", 2, 16)["layers_rows"] == pytest.approx(8 * 2 * 16 * (a * 64 + b * 4 * 16), rel=1e-12)
    for b, p, v in ((1, 15, 1000), (1, 15, 151936), (8, 128, 262144)):
        shape = Shape(2, 64, 4, 2, 128, v)
        got = estimate(shape, "directional_patch", b, p, fixed=False)["stacked_logits"]
        assert got == copies_per_forward(b, p, v) * b * p * v * 4
    # batch_size: one chunk of pairs at a time (its clean run, graph, logits, activations)
    assert estimate(s, "attribution", 4, 16, batch_size=1) == estimate(s, "attribution", 1, 16)
    assert estimate(Shape(2, 64, 4, 2, 128, 1000), "directional_patch", 1, 15, copies=8,
                    fixed=False)["stacked_logits"] == 8 * 15 * 1000 * 4
    assert estimate(s, "profile", 1, 1)["fixed"] > 0.5 * MB
    # what the summaries keep: per layer 3 residual groups of 4 float32 values and an int32 id,
    # per head 9 + 2 values and two ids, for the batches before the last; past exact_quantiles
    # the values kept until then and the int64 histograms (and one bincount output beside them)
    per_token = 8 * (3 * 4 * 5 + 4 * (4 * 10 + 4 * 3))
    assert memory_model.kept_bytes_per_token(s) == per_token
    assert estimate(s, "profile", 2, 16, fixed=False)["kept_values"] == 0
    assert estimate(s, "profile", 2, 16, fixed=False, tokens=320)["kept_values"] == per_token * 288
    hist = memory_model.histogram_bytes(s)
    assert hist == 8 * (24 * 9_808 + 32 * 28_418 + 32 * 3_404 + 32 * 28_418)
    capped = estimate(s, "profile", 2, 16, fixed=False, tokens=320, exact_quantiles=100)
    assert (capped["kept_values"], capped["histograms"]) == (per_token * 100, hist)
    flat = estimate(s, "profile", 2, 16, fixed=False, tokens=10**6, exact_quantiles=0)
    assert (flat["kept_values"], flat["histograms"]) == (0, hist)
    # run_with_cache of the profile's hooks: per layer z, v, the pattern and 4 stream rows, one
    # more stream row; beside it the forward's end (logits and the final norm's output)
    c = estimate(Shape(8, 64, 4, 2, 256, 10_000), "cache_split", 2, 16, fixed=False)
    assert c["cache"] == 8 * (32 * (4 * 64 + 6 * 16) * 4 + 2 * 4 * 16 * 16 * 4) + 32 * 64 * 4
    assert (c["logits"], c["final_stream"]) == (32 * 10_000 * 4, 32 * 64 * 4)
    with pytest.raises(ValueError, match="not modelled"):
        estimate(s, "train", 1, 1)
    # what cannot apply raises, naming the argument
    with pytest.raises(ValueError, match="tokens= and exact_quantiles= apply to analysis 'profile' only"):
        estimate(s, "forward", 2, 16, tokens=64)
    with pytest.raises(ValueError, match="tokens=16 is under one batch"):
        estimate(s, "profile", 2, 16, tokens=16)
    with pytest.raises(ValueError, match="exact_quantiles=-1 must be >= 0"):
        estimate(s, "profile", 2, 16, exact_quantiles=-1)


@pytest.mark.bridge
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_memory_model_graph_term_counts_what_autograd_saves(tiny_model_dir, dtype):
    """The ``graph`` term against the bytes autograd saves in attribution's corrupted forward
    (parameters frozen, the graph starting at the first stream), counted with
    ``torch.autograd.graph.saved_tensors_hooks`` on the tiny Llama (GQA, gated MLP), storage
    by storage, in float32 and in bfloat16 (where the norms' float32 inputs and the softmax's
    float32 probabilities are saved beside the bfloat16 tensors); the final norm's saved float32
    input and the rows beside it are outside the term. The model is of the bridge's HF modules:
    the legacy ``HookedTransformer``'s own block saves 1.7x as much on this model (its einsum
    attention and hook copies), which the model does not cover."""
    import torch

    from benchmarks.memory_model import Shape, estimate
    from tl_directional import load_model
    from tl_directional.evaluate.patching.attribution_passes import frozen_parameters

    model = load_model(tiny_model_dir("llama"), dtype=getattr(torch, dtype)).eval()
    b, p = 2, 12
    tokens = torch.randint(1, 500, (b, p), generator=torch.Generator().manual_seed(0))
    params = {q.untyped_storage().data_ptr() for q in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def leaf(t, hook):  # noqa: ARG001 - TL hook signature
        return t.detach().requires_grad_(True)

    with (torch.enable_grad(), frozen_parameters(model), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
          model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", leaf)])):
        model(tokens)
    outside = 2 * b * p * model.cfg.d_model * 4  # the final norm's float32 input and the rows beside it
    want = estimate(Shape.of(model), "attribution", b, p, dtype, fixed=False)["graph"]
    assert abs((sum(saved.values()) - outside) / want - 1) <= 0.10, (sum(saved.values()), want)


#: Points whose live count is within 10% but whose VmHWM the model (with its first-call term)
#: misses by more: glibc's heap keeps freed blocks under the probe's 64 KiB mmap threshold resident
#: and, in bfloat16, about 10 MB lies outside torch's tensors (docs/performance.md, "What the
#: misses were"): (size, dtype, analysis, settings) -> the lowest VmHWM ratio accepted.
RSS_MISSES = {("smollm2-135m", "float32", "attribution_transformer_lens", ""): 0.75,
              ("smollm2-135m", "float32", "get_act_patch_resid_pre", ""): 0.75,
              ("smollm2-135m", "bfloat16", "get_act_patch_resid_pre", ""): 0.75,
              ("qwen3-0.6b", "float32", "attribution_transformer_lens", ""): 0.80,
              ("llama-3.2-1b", "bfloat16", "attribution_transformer_lens", ""): 0.75,
              ("llama-3.2-1b", "bfloat16", "attribution", "layers_per_pass=2"): 0.85,
              ("llama-3.2-1b", "bfloat16", "attribution", "batch_size=1"): 0.85,
              ("qwen3-0.6b", "float32", "attribution", "batch_size=1"): 0.75,
              ("smollm2-135m", "float32", "attribution", "batch_size=1"): 0.70,
              ("qwen2.5-1.5b", "bfloat16", "attribution_transformer_lens", ""): 0.75,
              ("qwen2.5-1.5b", "bfloat16", "attribution", "batch_size=1"): 0.80,
              # the bfloat16 rows fit on four sizes' live points (0.92-1.07) reads this one point's
              # VmHWM at 0.88; the same call's VmHWM in the corpus run reads 0.94
              ("llama-3.2-1b", "bfloat16", "profile", ""): 0.85}


def test_memory_model_is_within_ten_percent_of_the_committed_measurements():
    """Every committed peak increment (:data:`MEMORY_POINTS`, the harness's probe) to 10%: where a
    point has a live count (the bytes of the tensors alive, what the model describes), ours and
    TransformerLens's calls alike against it; where it has only VmHWM, our calls (the forward,
    the edit, ``directional_patch``, ``attribution_patch`` and ``profile``) against it, with the
    first-call term. Every size but ``tiny`` (increments of 0.3-2 MB, where the terms' rounding
    is the error). A point with both counts whose VmHWM is outside 10% is in :data:`RSS_MISSES`,
    held to its stated bound (but one whose weights were evicted before the call: its VmHWM is
    not the call's)."""
    from benchmarks.memory_model import check_files, main

    paths = [REPO_ROOT / "benchmarks" / "results" / name for name in MEMORY_POINTS]
    assert all(json.loads(p.read_text())["command"].startswith("python -m benchmarks.memory_model --measure")
               for p in paths)
    rows = check_files(paths)
    ours = ("forward", "forward_no_logits", "edit", "profile", "directional_patch", "attribution")
    covered = [r for r in rows if r["size"] != "tiny" and r["resident"]
               and (r["count"] == "live" or r["analysis"] in ours)]
    live = [r for r in covered if r["count"] == "live"]
    assert {r["dtype"] for r in live if r["analysis"] == "attribution_transformer_lens"} == {"float32", "bfloat16"}
    assert {"llama-3.2-1b", "qwen2.5-1.5b"} <= {r["size"] for r in live}
    assert {"get_act_patch_resid_pre", "directional_patch", "profile"} <= {r["analysis"] for r in live}
    bad = [r for r in covered if abs(r["ratio"] - 1) > 0.10]
    assert not bad, bad

    def key(r):
        return r["size"], r["dtype"], r["analysis"], ",".join(
            f"{k}={r[k]}" for k in ("layers_per_pass", "batch_size") if r.get(k))

    rss_missed = {key(r): r["rss_ratio"] for r in live
                  if "rss_ratio" in r and r["rss_resident"] and abs(r["rss_ratio"] - 1) > 0.10}
    assert set(rss_missed) == set(RSS_MISSES), rss_missed
    assert all(RSS_MISSES[k] <= ratio < 0.90 for k, ratio in rss_missed.items()), rss_missed
    # the attribution table of docs/performance.md, generated from the same points
    assert main(["--check", str(REPO_ROOT / "benchmarks" / "results" / MEMORY_POINTS[0]), "--attribution"]) == 0


#: The committed corpus-length memory runs (python -m benchmarks.scaling --corpus-memory) and the
#: sides of each the memory model is checked against: session 24's naive caches, and session 25's
#: streaming profiles (by default and with exact_quantiles=0) measured after the kept values were
#: made compact (its streaming points supersede session 24's, measured before). A later file's
#: point replaces an earlier one's (same size, dtype, side and multiplier).
CORPUS_POINTS = {"issue51_corpus_memory_s24_360m.json": ("naive",),
                 "issue51_corpus_memory_s24_mid.json": ("naive",),
                 "issue51_corpus_memory_s24_1.5b.json": ("naive",),
                 "issue51_corpus_memory_s24_360m_long.json": ("naive",),
                 "issue51_corpus_memory_s25_streaming.json": ("streaming", "streaming-histogram"),
                 "issue51_corpus_memory_s25_llama_naive.json": ("naive",),
                 "issue51_corpus_memory_s26_live_qwen2.5.json": ("streaming", "streaming-histogram")}


def corpus_points() -> dict[tuple, tuple[float, float]]:
    """(size, dtype, side, multiplier, count) -> (measured MB, the memory model's prediction MB)
    of every measured point of :data:`CORPUS_POINTS`, ``count`` the run's (``rss``: VmHWM, the
    runs before session 26; ``live``: the live tensor bytes, predicted without the VmHWM terms)."""
    from benchmarks.memory_model import MB
    from benchmarks.scaling import corpus_prediction

    points = {}
    for name, sides in CORPUS_POINTS.items():
        for run in json.loads((REPO_ROOT / "benchmarks" / "results" / name).read_text())["runs"]:
            mem = run["corpus_memory"]
            other, count = mem["compared_with"], mem.get("count", "rss")
            for side in sides:
                key = "streaming_peak_increment_mb" if side == "streaming" else "naive_peak_increment_mb"
                if side != "streaming" and side != other:
                    continue
                for m, got in zip(mem["multipliers"], mem[key], strict=True):
                    if got is not None:
                        pred = corpus_prediction(run["size"], side, run["dtype"], mem["seq"], mem["batch_size"], m,
                                                 count) / MB
                        points[(run["size"], run["dtype"], side, m, count)] = (got, pred)
    return points


def test_memory_model_is_within_ten_percent_of_the_corpus_memory_points():
    """Issue 51: every committed corpus-length point (VmHWM, 256-4,096 tokens a corpus, 360M-1.5B
    parameters, float32 and bfloat16) against the memory model: the naive way (``run_with_cache``
    of the profile's hooks over the whole corpus + ``Profile.from_cache``), the streaming profile
    and the streaming profile with ``exact_quantiles=0``, each within 10%; the VmHWM misses of
    :data:`CORPUS_MISSES` to their ranges, and each of them that has a live count within 10% in it."""
    points = corpus_points()
    assert {k[4] for k in points} == {"rss", "live"}
    sides = {k[2] for k in points}
    assert sides == {"naive", "streaming", "streaming-histogram"}, sides
    assert {k[0] for k in points} == {"smollm2-360m", "qwen3-0.6b", "llama-3.2-1b", "qwen2.5-1.5b"}
    assert {k[1] for k in points} == {"float32", "bfloat16"}
    bad = {k: round(pred / got, 3) for k, (got, pred) in points.items() if abs(pred / got - 1) > 0.10}
    assert set(bad) == set(CORPUS_MISSES), bad
    assert all(CORPUS_MISSES[k][0] <= ratio <= CORPUS_MISSES[k][1] for k, ratio in bad.items()), bad
    # the misses' live counts (within 10%, as every point above): the float32 one is a corpus run's,
    # the two one-batch bfloat16 ones the harness's profile record (the same call, held by the test above)
    assert ("qwen2.5-1.5b", "float32", "streaming", 16, "live") in points
    # the docs' tables say which count they hold: a live run's table is captioned, a VmHWM one is not
    from benchmarks import scaling_table

    def doc(name):
        return json.loads((REPO_ROOT / "benchmarks" / "results" / name).read_text())

    live = scaling_table.corpus_memory_table([doc("issue51_corpus_memory_s26_live_qwen2.5.json")])
    rss = scaling_table.corpus_memory_table([doc("issue51_corpus_memory_s25_streaming.json")])
    assert "Live tensor bytes" in live and "| 197.0 (0.99) |" in live and "Live tensor bytes" not in rss


#: Corpus points (VmHWM) outside 10%, each held to its stated range of prediction / measured.
#: One batch of 4 x 64 tokens in bfloat16 on the two builds with ``n_heads seq = d_model``: their
#: live counts are within it (54.0 and 52.9 MB against 57.9 and 55.4 predicted,
#: ``issue51_memory_cpu_live_bf16_profile_s25.json``); the VmHWM fit (two coefficients on four
#: sizes) does not follow glibc's slack, 2-14 MB at these sizes. qwen2.5-1.5b's float32 profile
#: of 4,096 tokens: VmHWM grew 1.23x faster than the kept values' bytes, its live count
#: (``issue51_corpus_memory_s26_live_qwen2.5.json``) is within 10% (llama-3.2-1b's same point read
#: 244.7 and 209.1 MB of VmHWM in two runs of one commit: one VmHWM reading is not decisive).
CORPUS_MISSES = {("smollm2-360m", "bfloat16", "streaming", 1, "rss"): (1.10, 1.20),
                 ("qwen3-0.6b", "bfloat16", "streaming", 1, "rss"): (1.10, 1.17),
                 ("qwen2.5-1.5b", "float32", "streaming", 16, "rss"): (0.88, 0.90)}


def test_memory_model_counts_what_the_profile_keeps():
    """The memory model's view of the streaming profile's summaries is the library's: the metrics
    each summary keeps and the bins of each histogram; and the fits are what ``--fit-profile``
    prints from the committed points (a change of a term refits them)."""
    from benchmarks import memory_model as mm
    from tl_directional.core.quantiles import BIN_SCALES
    from tl_directional.measure.stream import (
        DROP_COSINE_METRICS,
        EXCLUSIVE_METRICS,
        RESIDUAL_METRICS,
        VALUE_METRICS,
    )

    residual = {k: v for k, v in RESIDUAL_METRICS.items() if k not in DROP_COSINE_METRICS}
    assert (mm.RESIDUAL_METRIC_COUNT, mm.VALUE_METRIC_COUNT, mm.EXCLUSIVE_METRIC_COUNT) == (
        len(residual), len(VALUE_METRICS), len(EXCLUSIVE_METRICS))
    bins = [sum(BIN_SCALES[s].n_bins + 2 for s in m.values()) for m in (residual, VALUE_METRICS, EXCLUSIVE_METRICS)]
    assert bins == [mm.RESIDUAL_BINS, mm.VALUE_BINS, mm.EXCLUSIVE_BINS]
    rows = mm.fit_rows()
    for (dtype, count), sizes in mm.FIT_SIZES.items():
        fit = mm.fit_profile_rows(rows, sizes, dtype, count)
        held = (mm.PROFILE_BYTES_RSS if count == "rss" else mm.PROFILE_BYTES)[dtype]
        assert fit == pytest.approx(held, abs=0.006), (dtype, count)


def test_kernel_paths_run_each_path_in_alternating_subprocesses(tiny_model_dir, tmp_path):
    """Issue 51: ``python -m benchmarks.kernel_paths`` runs the records under torch's own kernel
    path and under AVX2 forced (one subprocess per path and round, the order reversed every other
    round), pools each path's pairs, and keeps the capability each subprocess ran and its kernel
    variables; an unknown path is a usage error."""
    from benchmarks import kernel_paths

    out = tmp_path / "kernel_paths.json"
    status = kernel_paths.main(["--model", str(tiny_model_dir("gpt2")), "--records", "edit_overhead",
                                "--setting", "8x1", "--rounds", "2", "--pairs", "1", "--warmup", "0",
                                "--json", str(out)])
    doc = json.loads(out.read_text())
    assert status == 0, doc
    assert [o["variant"] for o in doc["order"]] == ["default", "avx2", "avx2", "default"]
    for variant in doc["variants"]:
        (rec,) = variant["records"]
        assert rec["name"] == "edit_overhead" and rec["n_pairs"] == 2 and rec["ratio"] > 0
        assert len(rec["round_ratios"]) == 2
        for run in variant["runs"]:
            want = {k: v for k, v in kernel_paths.PATHS[variant["path"]].items()}
            assert run["machine"]["kernel_env"] == want
    caps = {v["path"]: v["cpu_capability"] for v in doc["variants"]}
    if caps["default"][0] in ("AVX2", "AVX512"):  # an x86 CPU: the forced path is the one run
        assert caps["avx2"] == ["AVX2"]
    assert kernel_paths.main(["--paths", "avx9", "--json", str(out)]) == 2


def test_breakdown_times_every_stage_once_and_puts_the_functions_back(tiny_model):
    """Issue 51: ``python -m benchmarks.breakdown`` wraps the functions a profile call and a value
    edit run per layer with timers, reports each stage's own time (its total less the timed stages
    it calls, so the stages add up to at most the call) and restores every wrapped function."""
    from benchmarks import breakdown
    from benchmarks.workloads import text_batch
    from tl_directional.core import kernels
    from tl_directional.core.stats import StreamingSummary
    from tl_directional.edit import forms, value
    from tl_directional.measure import profiler, stream

    model = tiny_model("llama")
    batch = text_batch(model, 2, 8)
    originals = (stream.split_stats, stream.value_stats, StreamingSummary.__dict__["update"],
                 profiler._streaming_hooks, value.value_split_scaled)
    prof = breakdown.profile_breakdown(model, batch, 1)
    edit = breakdown.edit_breakdown(model, batch, 1)
    stages = {r["stage"]: r["seconds"] for r in prof}
    for _, _, label in breakdown.PROFILE_STAGES:
        assert label in stages, label
    assert stages["residual splits (split_stats)"] > 0 and stages["value splits (value_stats)"] > 0
    total = stages["candidate call (total)"]
    timed = sum(s for k, s in stages.items() if k not in ("candidate call (total)", "forward with logits (baseline)")
                and not k.startswith("  of which") and not k.startswith("candidate, untimed"))
    assert 0 < timed <= total
    assert {r["stage"] for r in edit} >= {"edit split (value_split_scaled)", "edit output check (cast_back)"}
    assert all(r["share_of_forward"] == r["seconds"] / prof[0]["seconds"] for r in prof)
    assert originals == (stream.split_stats, stream.value_stats, StreamingSummary.__dict__["update"],
                         profiler._streaming_hooks, value.value_split_scaled)
    assert stream.split_stats is kernels.split_stats and value.value_split_scaled is forms.value_split_scaled


def test_dot_paths_times_both_row_dot_paths_and_puts_the_choice_back(tmp_path):
    """Issue 51: ``python -m benchmarks.dot_paths`` times one layer's measuring kernels with
    ``row_dot``'s GEMM path against its product-and-sum path in pairs, writes the ratio and its
    interval, and leaves the machine's own choice (``kernels._GEMM_DOTS``) as it found it; a
    ratio needs two pairs at least."""
    from benchmarks import dot_paths
    from tl_directional.core import kernels

    chosen = kernels._GEMM_DOTS
    out = tmp_path / "dots.json"
    assert dot_paths.main(["--tokens", "16", "--pairs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert kernels._GEMM_DOTS is chosen
    assert doc["pairs"] == 2 and len(doc["gemm_s"]) == len(doc["product_sum_s"]) == 2
    assert doc["ci95"][0] <= doc["ratio_product_sum_over_gemm"] <= doc["ci95"][1]
    assert doc["path_chosen_here"] == ("gemm" if chosen else "product_sum")
    assert dot_paths.main(["--pairs", "1"]) == 2
