"""The pass-training study (``studies.pass_training``) end to end on a minuscule config (``--scale smoke``) in a tmp dir: the
learning-rate choice, every own-trainer and HF-callback task, collect, the page and its verdict
rows; then a lost record rerun by the process scheduler (``--jobs 2``) alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies.pass_training import cli as pass_cli
from studies.pass_training import page as pass_page
from studies.pass_training import run as pass_run
from tl_directional.io.corpus import heldout_text
from tl_directional.model.load import train_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("pass-corpus")
    lines = heldout_text().splitlines()
    tok = train_tokenizer("\n".join(lines[:600]), 300)
    tok.save_pretrained(str(root / "tokenizer"))
    meta = {"name": "tiny", "dtype": "uint16", "eot_id": 0, "splits": {}}
    for split, text in (("train", "\n".join(lines[:600])), ("validation", "\n".join(lines[600:700]))):
        ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [0]
        np.asarray(ids, dtype="<u2").tofile(root / f"{split}.bin")
        meta["splits"][split] = {"file": f"{split}.bin", "tokens": len(ids)}
    (root / "tokens.json").write_text(json.dumps(meta))
    return root


def test_run_collect_page_and_resume(corpus, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    common = ["--out", str(out), "--corpus", str(corpus), "--scale", "smoke"]
    assert pass_cli.main(["run", *common, "--jobs", "0", "--allow-dirty"]) == 0
    names = pass_run.tasks("smoke")
    assert sorted(p.stem for p in (out / "results").glob("*.json")) == sorted(names)
    lr = json.loads((out / "lr.json").read_text())
    losses = lr["candidates"]
    assert lr["lr"] == min(pass_run.LR_CANDIDATES, key=lambda k: (losses[f"{k:g}"], k))
    rec = json.loads((out / "results" / "own-vpara-s1.json").read_text())
    assert rec["config"]["lr"] == lr["lr"] and rec["config"]["max_steps"] == pass_run.SCALES["smoke"]["max_steps"]
    assert rec["corpus"]["single_pass"] and len(rec["shares_after"]) == pass_run.SCALES["smoke"]["n_layers"]
    # the edit removes the parallel part it targets: what the vpara model's value heads put along
    # their own value is removed, but it is read before the edit, so it is still there to read
    assert 0 < rec["shares_after"][0]["value_share"] < 1
    hf = json.loads((out / "results" / "hf-attn-para-s0.json").read_text())
    assert len(hf["train_losses"]) == pass_run.SCALES["smoke"]["max_steps"]

    assert pass_cli.main(["collect", *common, "--data", str(data), "--allow-dirty"]) == 0
    manifest = json.loads((data / "pass8m.manifest.json").read_text())
    assert manifest["complete"] and manifest["config"]["lr"] == lr["lr"]
    page = pass_page.build_page("pass8m", data)
    for text in ("## Verdicts", "attn-para - baseline", "value before", "smaller in parameters", "HF `Trainer`",
                 "Reading (computed from the table above)", "- vpara (mean over seeds 0, 1, 2): "):
        assert text in page
    figs = pass_page.build_figures("pass8m", data)
    assert sorted(figs) == ["pass8m_gap.svg", "pass8m_loss.svg", "pass8m_shares.svg"]
    assert all(f.startswith("<svg") and f == g for f, g in zip(figs.values(), pass_page.build_figures("pass8m", data).values(),
                                                                strict=True))
    for name in figs:
        assert f"]({name})" in page
    rows = pass_page.verdict_rows("pass8m", data)
    assert [r[0].split(" lowers")[0] for r in rows] == [
        "4: training with full-aggregate value-space V-Para (per head)",
        "4: training with residual-space parallel suppression of the attention update"]
    # the statistic is the paired difference of the committed finals, recomputed here
    finals = {(r["variant"], r["seed"]): r["final_val_loss"]
              for r in (json.loads(p.read_text()) for p in (out / "results").glob("own-*.json"))}
    diffs = [finals[("vpara", s)] - finals[("baseline", s)] for s in pass_run.SEEDS]
    assert f"{sum(diffs) / len(diffs):+.4f}" in rows[0][1]
    # the lead table's training cells state the same pairs and verdicts, and the scale gap
    ours, verdicts, reading = pass_page.lead_cells("pass8m", data)
    assert ours == f"{rows[0][1]}; {rows[1][1]}"
    assert verdicts == f"vpara {rows[0][2]}; attn-para {rows[1][2]}"
    sc = pass_page.scale(manifest["config"])
    assert f"about {sc['paper_params_x']:,.0f}x fewer parameters" in reading

    # a lost task shows on the page as not yet landed, and the verdicts wait for it
    _, t = pass_page.load("pass8m", data)
    assert pass_page.missing(t["final"]) == []
    short = t["final"][~((t["final"].path == "own") & (t["final"].variant == "attn-para") & (t["final"].seed == 1))]
    assert pass_page.missing(short) == ["own-attn-para-s1"]
    assert pass_page.verdict(pass_page.paired(short, "attn-para")[1], len(pass_page.paired(short, "attn-para")[0])) == \
        "not decided (runs incomplete)"

    # an edited data file is refused
    (data / "pass8m.final.csv").write_text("variant,seed\n")
    with pytest.raises(pass_page.DataError, match="pass8m.final.csv"):
        pass_page.build_page("pass8m", data)

    # a lost record: only that task runs again, through the process scheduler
    (out / "results" / "own-baseline-s2.json").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    assert pass_cli.main(["run", *common, "--jobs", "2", "--poll", "0.2", "--allow-dirty"]) == 0
    after = {p.name: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    assert set(after) - set(before) == {"own-baseline-s2.json"}
    assert all(after[k] == v for k, v in before.items())
    redo = json.loads((out / "results" / "own-baseline-s2.json").read_text())
    assert redo["final_val_loss"] == finals[("baseline", 2)]  # resumed from its last checkpoint: same run
    # its log (appended to across restarts) starts the new attempt with a dated header
    assert (out / "own-baseline-s2.log").read_text().startswith("--- ")
    assert "started: -m studies.pass_training.cli task own-baseline-s2" in (out / "own-baseline-s2.log").read_text()


def test_kept_records_carry_the_grid_to_a_new_machine(corpus, tmp_path):
    """Finished records go to --keep as they land; a new --out (a new machine) takes them from
    there and runs nothing again; collect on that machine reads them."""
    keep, first = tmp_path / "keep", tmp_path / "first"
    common = ["--corpus", str(corpus), "--scale", "smoke", "--keep", str(keep), "--allow-dirty"]
    assert pass_cli.main(["run", "--out", str(first), *common, "--jobs", "0"]) == 0
    kept = sorted(p.name for p in keep.iterdir())
    assert kept == sorted(["launch.json", "lr.json", *(f"{t}.json" for t in pass_run.tasks("smoke"))])
    assert (keep / "own-vpara-s2.json").read_bytes() == (first / "results" / "own-vpara-s2.json").read_bytes()

    # a new machine: an empty --out, one kept record lost; only that task runs
    (keep / "own-baseline-s1.json").unlink()
    second = tmp_path / "second"
    assert pass_cli.main(["run", "--out", str(second), *common, "--jobs", "0"]) == 0
    for name in kept:
        if name != "own-baseline-s1.json":
            src = second / (name if name in ("launch.json", "lr.json") else f"results/{name}")
            assert src.read_bytes() == (keep / name).read_bytes(), name
    redone = json.loads((keep / "own-baseline-s1.json").read_text())
    assert redone["final_val_loss"] == pytest.approx(
        json.loads((first / "results" / "own-baseline-s1.json").read_text())["final_val_loss"], abs=1e-6)

    # collect on a third machine reads the kept records alone
    data = tmp_path / "data"
    assert pass_cli.main(["collect", "--out", str(tmp_path / "third"), *common, "--data", str(data)]) == 0
    assert json.loads((data / "pass8m.manifest.json").read_text())["complete"]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "lr.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"lr.json is not a readable record .*delete it to rerun"):
        pass_cli.main(["run", "--out", str(tmp_path / "fourth"), "--corpus", str(corpus), "--scale", "smoke",
                "--keep", str(bad), "--jobs", "0", "--allow-dirty"])
