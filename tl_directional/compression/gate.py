"""The label-free compression gate (METHOD.md sec. 6): :func:`compress_check` passes when the
perpendicular error of every checked (layer, component) row of a compressed model stays within
a threshold; :class:`CheckResult` is its verdict, table, text summary and HTML page.
The command ``tl-directional compress-check`` (in :mod:`tl_directional.cli`) runs it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core.errors import renamed_argument
from ..figures.gate import compress_check_page
from ..io.outputs import replace_dir
from ..model.finite import nonfinite_parameters
from ..model.sites import resolve_sites
from .geometry import compression_geometry, normalize_targets

GATE_METRICS = ("err_perp_energy", "err_perp_over_update", "err_perp_energy_vs_resid")
#: What ``compress_check(component=...)`` / ``--component`` accepts.
GATE_COMPONENTS = ("attn", "mlp", "block", "all")


@dataclass
class CheckResult:
    """Outcome of :func:`compress_check`. ``passed`` is the verdict; ``table`` has every
    checked (layer, component) row with a ``status`` column (the component in its ``unit``
    column, as in :func:`compression_geometry`); ``units`` are the checked components;
    ``reasons`` says why it failed."""

    passed: bool
    threshold: float
    metric: str
    units: tuple[str, ...]
    mode: str
    table: pd.DataFrame
    reasons: list[str]
    geometry: pd.DataFrame
    dense_name: str = "dense"
    compressed_name: str = "compressed"

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def worst(self, n: int = 10) -> pd.DataFrame:
        return self.table.sort_values(self.metric, ascending=False, kind="stable").head(n)

    def _summary_columns(self) -> list[str]:
        cols = ["unit", "layer", self.metric, "err_par_energy", "err_perp_share_energy", "cos_sim",
                "rel_mse_energy", "status"]
        return list(dict.fromkeys(c for c in cols if c in self.table))

    def summary(self, n: int = 10) -> str:
        """A one-screen text report: verdict, threshold, the ``n`` worst layers."""
        verdict = "PASS" if self.passed else "FAIL"
        worst = self.table[self.metric].max() if len(self.table) else math.nan
        head = (f"compress-check {verdict}: max {self.metric} = {worst:.4f} "
                f"(threshold {self.threshold:g}; units {', '.join(self.units)}; {self.mode} mode; "
                f"{self.geometry.attrs.get('tokens', 0)} tokens)")
        cols = self._summary_columns()
        with pd.option_context("display.width", 120, "display.max_columns", 12, "display.precision", 4):
            body = self.worst(n)[cols].to_string(index=False)
        lines = [head, f"dense: {self.dense_name}", f"compressed: {self.compressed_name}",
                 f"worst {min(n, len(self.table))} of {len(self.table)} (layer, unit) rows:", body]
        lines += [f"reason: {r}" for r in self.reasons]
        return "\n".join(lines)

    def write_report(self, directory, *, overwrite: bool = False) -> Path:
        """Write ``report.html`` (verdict, per-layer chart, tables; a :class:`~tl_directional.figures.page.Report`
        page) and ``geometry.csv`` into ``directory``, swapped in complete. ``directory`` must be
        absent, empty or a previous compress-check report; anything else needs ``overwrite``."""
        with replace_dir(directory, "compress-check-report", force=overwrite, force_hint="pass overwrite=True",
                         command="compress_check.write_report") as tmp:
            self._write_report(tmp)
        return Path(directory) / "report.html"

    def _write_report(self, out: Path) -> Path:
        self.geometry.to_csv(out / "geometry.csv", index=False)
        return compress_check_page(self).save(out / "report.html")


def compress_check(dense, compressed, inputs, *, max_perp_error: float, component: str = "block",
                   mode: str = "local", metric: str = "err_perp_energy", batch_size: int = 8,
                   fail_on_removed_update: bool = True, dense_name: str = "dense",
                   compressed_name: str = "compressed", progress: bool = False,
                   geometry: pd.DataFrame | None = None, unit: str | None = None) -> CheckResult:
    """Label-free gate: pass when the perpendicular error of every checked (layer, component)
    row stays within ``max_perp_error``.

    Args:
        component: ``"attn"``, ``"mlp"``, ``"block"`` (default; post-LN models have no block,
            so their attention and MLP are checked) or ``"all"``.
        metric: ``"err_perp_energy"`` (headline), ``"err_perp_over_update"`` (per-token mean)
            or ``"err_perp_energy_vs_resid"``.
        fail_on_removed_update: also fail when a unit's compressed update is exactly zero (a
            dropped layer: its error is purely parallel, so a perpendicular threshold cannot
            see it).
        geometry: reuse a table from :func:`compression_geometry` instead of measuring.
        unit: the former name of ``component``: refused with a
            :class:`~tl_directional.core.errors.RenamedArgumentError` naming ``component``.
    """
    if unit is not None:
        raise renamed_argument("compress_check", "unit", "component")
    if component not in GATE_COMPONENTS:
        raise ValueError(f"component must be one of {GATE_COMPONENTS}, got {component!r}")
    # Checked before the metric: a NaN / inf weight is a FAIL even where no metric would see it
    # (``ln_f``, the unembedding) and it would otherwise turn the metrics into NaN.
    if metric not in GATE_METRICS:
        raise ValueError(f"metric must be one of {GATE_METRICS}, got {metric!r}")
    try:
        threshold = float(max_perp_error)
    except (TypeError, ValueError):
        raise ValueError(f"max_perp_error must be a number, got {max_perp_error!r}") from None
    if not (threshold >= 0 and threshold < float("inf")):
        raise ValueError(f"max_perp_error must be a finite number >= 0, got {max_perp_error!r}")
    sites = resolve_sites(dense, warn=False)
    if component == "all":
        units = sites.components
    elif component == "block" and "block" not in sites.units:
        units = ("attn", "mlp")
    else:
        units = (component,)
    models = [("dense", dense)] + [(name, m) for name, m, _ in normalize_targets(compressed)]
    bad_weights = [f"{which} {name} ({count} non-finite values)"
                   for which, model in models for name, count in nonfinite_parameters(model)]
    if bad_weights:
        empty = pd.DataFrame({"unit": pd.Series(dtype=str), "layer": pd.Series(dtype=int),
                              metric: pd.Series(dtype=float), "status": pd.Series(dtype=str)})
        reasons = ["non-finite (NaN / inf) weights, which no threshold can pass: " + ", ".join(bad_weights)]
        return CheckResult(False, threshold, metric, tuple(units), mode, empty, reasons, pd.DataFrame(),
                           dense_name, compressed_name)
    if geometry is None:
        geometry = compression_geometry(dense, compressed, inputs, mode=mode, components=units,
                                        batch_size=batch_size, progress=progress)
    table = geometry[geometry.unit.isin(units)].copy()
    finite = table["finite"].astype(bool) if "finite" in table else pd.Series(True, index=table.index)
    nonfinite = ~finite | ~table[metric].map(math.isfinite).astype(bool)
    over = (table[metric] > threshold) & ~nonfinite
    removed = table["by_construction_parallel"].astype(bool) & ~nonfinite
    table["status"] = "ok"
    table.loc[over, "status"] = "FAIL"
    table.loc[nonfinite, "status"] = "FAIL (non-finite)"
    reasons = []
    if nonfinite.any():
        which = ", ".join(f"{r.unit} layer {int(r.layer)}" for r in table[nonfinite].itertuples())
        reasons.append(f"non-finite (NaN / inf) activations or errors at {which}: the gate cannot "
                       "measure them, so they fail")
    if over.any():
        worst = table.loc[table[metric].idxmax()]
        reasons.append(f"{int(over.sum())} row(s) over the threshold; worst {worst.unit} layer "
                       f"{int(worst.layer)}: {metric} = {worst[metric]:.4f} > {threshold:g}")
    if removed.any():
        table.loc[removed, "status"] = "FAIL (update removed)" if fail_on_removed_update else "update removed"
        which = ", ".join(f"{r.unit} {int(r.layer)}" for r in table[removed].itertuples())
        msg = (f"compressed update is exactly zero at {which}: the error there is purely parallel "
               "(e = -u), which a perpendicular threshold cannot see")
        reasons.append(msg if fail_on_removed_update else "warning: " + msg)
    passed = not over.any() and not nonfinite.any() and not (fail_on_removed_update and removed.any())
    return CheckResult(passed, threshold, metric, tuple(units), mode, table.reset_index(drop=True), reasons,
                       geometry, dense_name, compressed_name)


__all__ = ["GATE_COMPONENTS", "GATE_METRICS", "CheckResult", "compress_check"]
