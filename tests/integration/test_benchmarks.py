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
from benchmarks.registry import STATUSES  # noqa: E402
from benchmarks.timing import median_ci, paired_timing  # noqa: E402

CONTRACT = {
    "profile_overhead": 1.00,
    "profile_vs_handwritten": 0.90,
    "peer_nnsight": 0.85,
    "profile_vs_cache": 1.0,
    "edit_overhead": 1.05,
    "sweep_cost": 1.05,
    "sweep_shared_prefix": 0.80,
    "train_step_overhead": 1.10,
    "compression_local_cost": 2.0,
    "layer_sweep_shared_prefix": 0.60,
    "patching_vs_transformer_lens": 0.20,
}
ALWAYS_AVAILABLE = ("profile_overhead", "profile_vs_handwritten", "profile_vs_cache",
                    "edit_overhead", "sweep_shared_prefix", "layer_sweep_shared_prefix",
                    "patching_vs_transformer_lens")
VERDICTS = ("met", "missed", "too noisy")
RECORD_FIELDS = ("name", "setting", "primary", "status", "reason", "target", "target_op", "met",
                 "ratio", "ci95", "n_pairs", "times", "extra", "baseline", "candidate")
MACHINE_FIELDS = ("cpu_count", "torch_version", "transformer_lens_version", "device", "dtype",
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
