"""Protocol sec. 13.3-13.4's statistics and rules on the probe's records (``ruler_<model>``), pure
functions of the records table (one row per item and setting: ``length``, ``haystack``, ``task``,
``setting``, ``correct``), for the page to print.

Accuracy is in points. Every interval is a 95% percentile bootstrap over **haystacks** (the
clusters: one haystack hosts one item of each task), stratified by length, 2,000 resamples, seed 0
(``tl_directional.core.paired.cluster_draw_counts``), the same draws for every setting, so
differences between settings are paired. Headroom ``H`` = baseline accuracy minus 25 (chance), per
length, inside each resample. Pooling over lengths (sec. 13.6): the mean over the lengths, each
length weight 1 (whatever its number of haystacks: sec. 13.10's CPU design scores fewer at 2,048). A resample whose headroom at some
length is not positive gives no ratio (NaN) and is left out of that rule's quantiles.
"""

from __future__ import annotations

from dataclasses import dataclass

N_RESAMPLES, SEED, LEVEL = 2000, 0, 0.95
CHANCE = 25.0
#: L1's threshold: the half-retention drop as a share of the headroom
L1_MARGIN = 0.10
EXCL = {0: "value-exclusive-joint skip0 s_par=0", 0.5: "value-exclusive-joint skip0 s_par=0.5"}
VPARA = {0: "value-full-joint skip0 s_par=0", 0.5: "value-full-joint skip0 s_par=0.5"}
HARD = "hard-diag skip0"


@dataclass(frozen=True)
class Stat:
    """A statistic's ``point`` on the data, its interval ``[lo, hi]`` and verdict (``"-"``: no rule)."""

    point: float
    lo: float
    hi: float
    verdict: str = "-"


def per_length_accuracy(rec, tasks, settings, n_resamples: int = N_RESAMPLES, seed: int = SEED):
    """``(lengths, point, resamples)``: accuracy in points per setting and length over the items of
    ``tasks``: ``point[s]`` ``[n_lengths]`` on the data, ``resamples[s]`` ``[n_resamples,
    n_lengths]`` under the haystack bootstrap stratified by length (the same draws for every
    setting)."""
    import torch

    from tl_directional.core.paired import cluster_draw_counts

    sub = rec[rec["task"].isin(list(tasks))]
    wide = sub.pivot_table(index=["length", "haystack", "task"], columns="setting", values="correct").sort_index()
    keys = wide.index.to_frame(index=False)
    lengths = sorted(keys["length"].unique().tolist())
    length_id = torch.tensor([lengths.index(n) for n in keys["length"]], dtype=torch.long)
    pairs = list(dict.fromkeys(zip(keys["length"], keys["haystack"], strict=True)))
    cluster = torch.tensor([pairs.index(p) for p in zip(keys["length"], keys["haystack"], strict=True)])
    w = cluster_draw_counts(cluster, length_id, n_resamples, seed)[:, cluster]  # [R, n]
    onehot = torch.nn.functional.one_hot(length_id, len(lengths)).double()
    point, res = {}, {}
    for s in settings:
        c = torch.tensor(wide[s].to_numpy(), dtype=torch.float64)
        point[s] = 100.0 * (c @ onehot) / onehot.sum(0)
        res[s] = 100.0 * ((w * c) @ onehot) / (w @ onehot)
    return lengths, point, res


def interval(point: float, rs, held_below: float | None = None, held_above: float | None = None) -> Stat:
    """``point`` with the 95% percentile interval of its resamples ``rs`` (``[n_resamples]``, NaN left
    out) and, with a threshold, the verdict: ``held_below`` held if the whole interval is below it,
    ``held_above`` held if above; failed on the other side, not decided otherwise."""
    import torch

    q = torch.nanquantile(rs, torch.tensor([(1 - LEVEL) / 2, (1 + LEVEL) / 2], dtype=torch.float64))
    lo, hi = float(q[0]), float(q[1])
    if held_below is not None:  # held if the whole interval is below the threshold
        v = "held" if hi < held_below else "failed" if lo > held_below else "not decided"
    elif held_above is not None:
        v = "held" if lo > held_above else "failed" if hi < held_above else "not decided"
    else:
        v = "-"
    return Stat(point, lo, hi, v)


def _ratio(drop, base):
    import torch

    head = base - CHANCE
    return torch.where(head > 0, drop / head, torch.full_like(drop, float("nan")))


def _slope(y, x):
    """Least-squares slope of ``y`` (``[..., n]``) over ``x`` (``[n]``)."""
    xc = x - x.mean()
    return ((y - y.mean(-1, keepdim=True)) * xc).sum(-1) / (xc * xc).sum()


def rules(rec, tasks, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> dict[str, Stat]:
    """Sec. 13.4's L1-L4 on the items of ``tasks`` (those with a verdict, sec. 13.2):

    * L1: mean over lengths of drop(exclude-self 0.5) / ``H``; held if the upper bound < 0.10;
    * L2: drop(V-Para 0.5) - drop(exclude-self 0.5), mean over lengths; held if the lower bound > 0;
    * L3: min over exclude-self 0 and V-Para 0 of drop(hard diagonal) - drop(that), each a mean over
      lengths, the min inside each resample; held if the lower bound > 0;
    * L4: the least-squares slope of drop(exclude-self 0.5) / ``H`` over log2(length); held if the
      lower bound > 0.

    Failed where the interval lies on the other side; not decided otherwise."""
    import torch

    names = ["baseline", EXCL[0], EXCL[0.5], VPARA[0], VPARA[0.5], HARD]
    lengths, pt, rs = per_length_accuracy(rec, tasks, names, n_resamples, seed)
    out = {}
    for use, acc in (("point", pt), ("res", rs)):
        drop = {s: acc["baseline"] - acc[s] for s in names[1:]}
        ratio = _ratio(drop[EXCL[0.5]], acc["baseline"])
        l3 = torch.minimum((drop[HARD] - drop[EXCL[0]]).mean(-1), (drop[HARD] - drop[VPARA[0]]).mean(-1))
        x = torch.log2(torch.tensor(lengths, dtype=torch.float64))
        out[use] = {"L1": ratio.mean(-1), "L2": (drop[VPARA[0.5]] - drop[EXCL[0.5]]).mean(-1), "L3": l3,
                    "L4": _slope(ratio, x)}
    p, r = out["point"], out["res"]
    return {
        "L1": interval(float(p["L1"]), r["L1"], held_below=L1_MARGIN),
        "L2": interval(float(p["L2"]), r["L2"], held_above=0.0),
        "L3": interval(float(p["L3"]), r["L3"], held_above=0.0),
        "L4": interval(float(p["L4"]), r["L4"], held_above=0.0),
    }


def verdict_tasks(rec, rungs: dict, floor: float, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> list[str]:
    """Sec. 13.2: the tasks with a verdict: every task whose pilot rung reached the floor
    (``rungs[task]["reached_floor"]``; needle-single has no ladder and always counts), and a task
    left on its easiest rung only if the main baseline's lower bound at 512 tokens is at least
    ``floor`` (0.35, in points 35)."""
    keep = []
    for task in rec["task"].drop_duplicates().tolist():
        if rungs.get(task, {}).get("reached_floor", True):
            keep.append(task)
            continue
        if baseline_at(rec, task, 512, n_resamples, seed).lo >= 100.0 * floor:
            keep.append(task)
    return keep


def baseline_at(rec, task: str, length: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> Stat:
    """The unedited model's accuracy on ``task`` at ``length`` tokens, in points, with its haystack
    bootstrap interval (sec. 13.2's entry test reads its lower bound at 512 tokens)."""
    lengths, pt, rs = per_length_accuracy(rec, [task], ["baseline"], n_resamples, seed)
    k = lengths.index(length)
    return interval(float(pt["baseline"][k]), rs["baseline"][:, k])
