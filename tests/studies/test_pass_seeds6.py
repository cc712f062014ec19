"""Protocol sec. 15 (claim 4 in a single pass at six seeds): the statistics on constructed data
against scipy, the task list and budget, and the extension runner end to end at the smoke size
(seeds 3-5, the V-Para rate check and V-Para at its own rate), its collect and the page section."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats as sps

from studies.pass_training import cli as pass_cli
from studies.pass_training import page as pass_page
from studies.pass_training import run as pass_run
from studies.pass_training import seeds6, seeds6_page
from studies.pass_training import stats as s6
from tests.studies.test_pass_training import corpus  # noqa: F401 - the tiny pre-tokenised corpus fixture

SEEDS6 = (0, 1, 2, 3, 4, 5)


def _scipy_interval(d: list[float]) -> tuple[float, float, float]:
    n = len(d)
    m = sum(d) / n
    half = sps.t.ppf(0.975, n - 1) * sps.tstd(d) / math.sqrt(n)
    return m, m - half, m + half


def test_six_seed_paired_intervals_match_scipy_and_the_rule():
    base = [4.456, 4.473, 4.478, 4.462, 4.469, 4.481]
    fin = {"baseline": dict(enumerate(base)),
           "vpara": {s: x - 0.05 + 0.01 * (-1) ** s for s, x in enumerate(base)},  # clearly lower
           "attn-para": {s: x + 0.004 * (s - 2.5) for s, x in enumerate(base)}}  # straddles 0
    assert round(sps.t.ppf(0.975, 5), 3) == 2.571  # the protocol's t
    for variant, ref, want in (("vpara", "baseline", "**held**"), ("attn-para", "baseline", "**not decided**"),
                               ("vpara", "attn-para", "**held**")):
        st = s6.paired(fin, variant, ref, SEEDS6)
        m, lo, hi = _scipy_interval([fin[variant][s] - fin[ref][s] for s in SEEDS6])
        assert st["n"] == 6 and st["seeds"] == list(SEEDS6)
        assert st["mean_diff"] == pytest.approx(m, abs=1e-12)
        assert (st["ci95_low"], st["ci95_high"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
        assert s6.verdict(st, []) == want
    worse = {"baseline": fin["baseline"], "vpara": {s: x + 0.03 + 0.001 * s for s, x in fin["baseline"].items()}}
    assert s6.verdict(s6.paired(worse, "vpara", "baseline", SEEDS6), []) == "**failed**"
    # a seed counts only when all three arms finished; the verdict waits for every seed
    part = {v: dict(x) for v, x in fin.items()}
    del part["attn-para"][4], part["vpara"][5], part["baseline"][5]
    counted = s6.counted_seeds(part, ("baseline", "vpara", "attn-para"), SEEDS6)
    assert counted == [0, 1, 2, 3]
    st = s6.paired(part, "vpara", "baseline", counted)
    assert st["n"] == 4 and st["ci95_high"] < 0
    assert s6.verdict(st, [4, 5]) == "not decided (seeds 4, 5 missing)"
    assert s6.verdict(None, [5]) == "not decided (seed 5 missing)"
    assert s6.paired(part, "vpara", "baseline", [0]) is None


def test_early_step_gap_is_the_paired_interval_of_per_seed_step_means():
    curves = {v: {} for v in ("baseline", "vpara")}
    for s in SEEDS6:
        for k, step in enumerate((0, 100, 200, 300, 400)):
            b = 9.0 - step / 100 + 0.01 * s
            curves["baseline"].setdefault(s, {})[step] = b
            curves["vpara"].setdefault(s, {})[step] = b - 0.1 / (k + 1) + 0.003 * ((s * 7 + k) % 5)
    del curves["vpara"][5][200]  # seed 5 lacks a step: left out and named
    got = s6.early_gap(curves, "vpara", "baseline", SEEDS6)
    per = [sum(curves["vpara"][s][k] - curves["baseline"][s][k] for k in (100, 200, 300)) / 3 for s in range(5)]
    m, lo, hi = _scipy_interval(per)
    assert got["incomplete"] == [5] and got["n"] == 5 and got["steps"] == [100, 200, 300]
    assert got["mean_diff"] == pytest.approx(m, abs=1e-12)
    assert (got["ci95_low"], got["ci95_high"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))


def test_rate_choice_tasks_and_budget():
    assert s6.best_lr({3e-3: 5.6, 1.5e-3: 5.6, 6e-3: 5.9}) == 1.5e-3  # ties: the smaller
    assert s6.best_lr({3e-3: 5.6, 1.5e-3: 5.7, 6e-3: 5.9}) == 3e-3
    with pytest.raises(ValueError, match="at least one candidate"):
        s6.best_lr({})
    assert seeds6.seed_tasks() == ["own-baseline-s3", "own-vpara-s3", "own-attn-para-s3", "own-baseline-s4",
                                   "own-vpara-s4", "own-attn-para-s4", "own-baseline-s5", "own-vpara-s5",
                                   "own-attn-para-s5"]
    assert seeds6.lr_tasks() == ["lr-vpara-0.0015", "lr-vpara-0.003", "lr-vpara-0.006"]
    assert seeds6.rate_tasks(None, 3e-3) == [] and seeds6.rate_tasks(3e-3, 3e-3) == []
    assert seeds6.rate_tasks(6e-3, 3e-3) == ["own-vpara-s0-lr0.006", "own-vpara-s1-lr0.006", "own-vpara-s2-lr0.006"]
    assert {"own-vpara-s2-lr0.0015.json", "lr.json", "launch-seeds6.json"} <= set(seeds6.kept_names())
    rows = [{"variant": v, "cpu_s_per_step": c, "eval_cpu_s": 18.0} for v, c in
            (("baseline", 2.5), ("vpara", 2.6), ("attn-para", 2.4))]
    sc = pass_run.SCALES["study"]
    got = seeds6.budget_hours(rows, sc)
    # 1,100 steps, evaluations at 0, 100, ..., 1,100 (12); the check: 275 steps, eval every 68 (0..272, 275: 6)
    assert got["seeds_cpu_h"] == pytest.approx(3 * (1100 * 7.5 + 3 * 12 * 18.0) / 3600)
    assert got["lr_check_cpu_h"] == pytest.approx(3 * (275 * 2.6 + 6 * 18.0) / 3600)
    assert got["total_cpu_h"] == pytest.approx(got["seeds_cpu_h"] + got["lr_check_cpu_h"])


def _args(out, corpus_dir, keep=None):
    return ["--out", str(out), "--corpus", str(corpus_dir), "--scale", "smoke", "--allow-dirty",
            *(["--keep", str(keep)] if keep else [])]


def test_extension_runs_collects_and_builds_its_section(corpus, tmp_path):  # noqa: F811
    out, data, keep = tmp_path / "out", tmp_path / "data", tmp_path / "keep"
    common = _args(out, corpus, keep)
    # sec. 10's part it builds on, cut to what sec. 15 reads: the shared rate (not a candidate, so
    # V-Para's best is never it and the own-rate arm runs too) and seeds 0-2 of the three arms
    (out / "results").mkdir(parents=True)
    (out / "lr.json").write_text(json.dumps({"lr": 0.002, "candidates": {}}))
    (out / "launch.json").write_text(json.dumps({"commit": "0000000", "dirty": False, "scale": "smoke",
                                                 "started": "-", "torch": "-", "jobs": 0}))
    args = pass_cli_args(out, corpus)
    base_tasks = [f"own-{v}-s{s}" for s in pass_run.SEEDS for v in pass_run.VARIANTS]
    assert pass_run.schedule(base_tasks, args) == ([], [])
    assert pass_cli.main(["collect", "--out", str(out), "--corpus", str(corpus), "--scale", "smoke",
                          "--allow-dirty", "--data", str(data)]) == 0
    before = pass_page.build_page("pass8m", data)
    assert "**Not run**: no run of seeds 3, 4, 5 has landed" in before
    assert "| V1: vpara - attn-para | not run | - | - | not run |" in before

    assert pass_cli.main(["run-seeds6", *common, "--jobs", "0"]) == 0
    best, losses = seeds6.vpara_lr(out)
    assert best == min(sorted(losses), key=losses.get)
    want = seeds6.lr_tasks() + seeds6.seed_tasks() + seeds6.rate_tasks(best, 0.002)
    assert sorted(p.stem for p in (out / "results").glob("*.json")) == sorted(base_tasks + want)
    assert sorted(p.name for p in keep.iterdir()) == sorted(["launch-seeds6.json", "lr.json",
                                                              *(f"{t}.json" for t in want)])
    rec = json.loads((out / "results" / "own-attn-para-s4.json").read_text())
    assert rec["config"]["lr"] == 0.002 and rec["seed"] == 4
    lr_rec = json.loads((out / "results" / f"lr-vpara-{best:g}.json").read_text())
    assert lr_rec["config"]["variant"] == "vpara" and lr_rec["config"]["seed"] == pass_run.LR_SEED
    assert json.loads((out / "results" / f"own-vpara-s1-lr{best:g}.json").read_text())["config"]["lr"] == best

    assert pass_cli.main(["collect-seeds6", *common, "--data", str(data)]) == 0
    manifest = json.loads((data / "pass8m.seeds6.manifest.json").read_text())
    assert manifest["complete"] and manifest["missing"] == [] and manifest["base"] == "pass8m.manifest.json"
    page = pass_page.build_page("pass8m", data)
    # sec. 10's part of the page is unchanged by the section
    head, tail = page.split("## Verdicts at six seeds", 1)
    assert before.startswith(head) and before.endswith(tail[tail.index("\n## Final validation loss per seed"):])
    fin = {(r["variant"], r["seed"]): r["final_val_loss"] for r in
           (json.loads(p.read_text()) for p in (out / "results").glob("own-*.json")) if r["config"]["lr"] == 0.002}
    for variant, ref, label in seeds6_page.COMPARISONS:
        d = [round(fin[(variant, s)], 6) - round(fin[(ref, s)], 6) for s in SEEDS6]
        m, lo, hi = _scipy_interval(d)
        assert f"| {label} | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] (6 seeds) |" in page
    assert "- Seeds counted (all three arms finished): 0, 1, 2, 3, 4, 5." in page
    assert "Early-step gap (a declared secondary, no verdict)" in page and "- vpara - baseline: -." in page
    assert f"Its best candidate is **{best:g}, not the baseline's 0.002**" in page
    own = [round(json.loads((out / "results" / f"own-vpara-s{s}-lr{best:g}.json").read_text())["final_val_loss"], 6)
           - round(fin[("baseline", s)], 6) for s in pass_run.SEEDS]
    m, lo, hi = _scipy_interval(own)
    assert f"minus baseline at 0.002: {m:+.4f} [{lo:+.4f}, {hi:+.4f}] (3 seeds)." in page

    # a lost record: the page names it and waits; only that task runs again (sec. 10's scheduler)
    (out / "results" / "own-attn-para-s4.json").unlink()
    (keep / "own-attn-para-s4.json").unlink()
    assert pass_cli.main(["collect-seeds6", *common, "--data", str(data)]) == 0
    page = pass_page.build_page("pass8m", data)
    assert "not yet landed: own-attn-para-s4" in page and "seed 4: baseline, vpara only" in page
    assert "| not decided (seed 4 missing) |" in page
    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    assert pass_cli.main(["run-seeds6", *common, "--jobs", "0"]) == 0
    again = {p.name: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    assert set(again) - set(stamp) == {"own-attn-para-s4.json"} and all(again[k] == v for k, v in stamp.items())
    assert json.loads((out / "results" / "own-attn-para-s4.json").read_text())["final_val_loss"] == fin[("attn-para", 4)]

    # a record trained with another config than sec. 10's is refused
    bad = json.loads((out / "results" / "own-vpara-s5.json").read_text())
    bad["config"]["d_mlp"] += 1
    (out / "results" / "own-vpara-s5.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match=r"own-vpara-s5 was trained with another config than sec. 10's \(d_mlp"):
        pass_cli.main(["collect-seeds6", *common, "--data", str(data)])


def pass_cli_args(out, corpus_dir):
    """The namespace :func:`studies.pass_training.run.schedule` reads, for sec. 10's tasks."""
    return argparse.Namespace(out=out, corpus=corpus_dir, scale="smoke", jobs=0, poll=0.2, keep=None)


def test_section_reads_not_run_without_sec15_data():
    final10 = pd.DataFrame([{"variant": v, "seed": s, "path": "own", "final_val_loss": 4.4 + 0.01 * s}
                            for v in pass_run.VARIANTS for s in pass_run.SEEDS])
    curves10 = pd.DataFrame([{"variant": v, "seed": s, "step": 100, "val_loss": 6.0}
                             for v in pass_run.VARIANTS for s in pass_run.SEEDS])
    lines = seeds6_page.section("pass8m", Path("/nonexistent"), final10, curves10, {"config": {"lr": 0.003}})
    text = "\n".join(lines)
    assert "## Verdicts at six seeds (protocol sec. 15)" in text and "(5 degrees of freedom, t = 2.571)" in text
    assert "seeds present: 0, 1, 2 of each arm (sec. 10)" in text
    assert [ln for ln in lines if ln.endswith("| not run |")] == [
        f"| {label} | not run | - | - | not run |" for _, _, label in seeds6_page.COMPARISONS]


def test_section_with_only_the_rate_check_and_one_seed_landed(tmp_path):
    """Partial sec. 15 data: V-Para's best rate is the shared one (no own-rate arm), seed 3 has
    two arms, so no new seed counts and every verdict waits for seeds 3-5."""
    from studies import common as studies_common

    final10 = pd.DataFrame([{"variant": v, "seed": s, "path": "own", "final_val_loss": 4.4 + 0.01 * s + 0.001 * k}
                            for k, v in enumerate(pass_run.VARIANTS) for s in pass_run.SEEDS])
    curves10 = pd.DataFrame([{"variant": v, "seed": s, "step": 100, "val_loss": 6.0}
                             for v in pass_run.VARIANTS for s in pass_run.SEEDS])
    final = b"variant,seed,lr,final_val_loss,cpu_s\nbaseline,3,0.003,4.470000,9000.0\nvpara,3,0.003,4.460000,9100.0\n"
    lr = (b"variant,seed,lr,max_steps,final_val_loss\nvpara,100,0.0015,275,5.700000\nvpara,100,0.003,275,5.600000\n"
          b"vpara,100,0.006,275,5.600000\n")
    curves = b"variant,seed,lr,step,tokens,train_loss,val_loss\n"
    studies_common.write_data(tmp_path, {"pass8m.seeds6.final.csv": final, "pass8m.seeds6.curves.csv": curves,
                                         "pass8m.seeds6.lr.csv": lr},
                              {"command": "c", "commit": "abc1234", "started": "s", "torch": "t",
                               "task_commits": ["abc1234"], "cpu_hours": 5.0, "complete": False,
                               "missing": ["own-attn-para-s3"], "files": {}}, "pass8m.seeds6.manifest.json")
    base = {"config": {"lr": 0.003}, "lr_choice": {"candidates": {"0.003": 5.6018}}}
    text = "\n".join(seeds6_page.section("pass8m", tmp_path, final10, curves10, base))
    assert "**incomplete**; not yet landed: own-attn-para-s3" in text
    assert "- Seeds counted (all three arms finished): 0, 1, 2; not counted (an arm unfinished): seed 3: baseline, " \
           "vpara only; not run: 4, 5." in text
    assert text.count("| not decided (seeds 3, 4, 5 missing) |") == 3
    assert "| 3 | 4.4700 | 4.4600 | - |" in text
    # a tie between 3e-3 and 6e-3 goes to the smaller, the shared rate
    assert "Its best candidate is the baseline's 0.003: the shared rate stands for V-Para too." in text
    # the early-step gap needs steps 100, 200 and 300: every seed is left out here
    assert "- vpara - baseline: -." in text
    # an edited data file is refused by name
    (tmp_path / "pass8m.seeds6.lr.csv").write_bytes(lr.replace(b"5.7", b"5.1"))
    with pytest.raises(pass_run.DataError, match="pass8m.seeds6.lr.csv"):
        seeds6_page.section("pass8m", tmp_path, final10, curves10, base)
