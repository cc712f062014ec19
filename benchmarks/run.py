"""Benchmark harness: cost ratios of tl-directional's measuring and editing paths.

Usage (from the repository root)::

    python -m benchmarks.run                      # default mode, a few minutes on 2 cores
    python -m benchmarks.run --quick --json q.json  # smoke run (seconds)
    python -m benchmarks.run --device cuda        # GPU mode, bf16

What is measured
----------------
Every record is a ratio ``candidate time / baseline time`` on the same batch, measured in the
same process: ratios are what we track, never absolute times (the machine is shared and its
speed changes by tens of percent from minute to minute). Records are small registered
functions (:mod:`benchmarks.registry`); the ones that exist are in :mod:`benchmarks.records`,
the ones whose feature is not built yet in :mod:`benchmarks.planned` (emitted with
``status: "not_available"``). Each record runs at several settings (sequence length x batch
size, plus a wider model) so the growth of the cost is visible; ``primary: true`` marks the
headline setting, which ``summary`` in the JSON repeats per record name.

Timing method
-------------
* **Pairs, interleaved.** One measurement is a pair: one call of the baseline and one call of
  the candidate, back to back, each timed with ``time.perf_counter`` (after
  ``torch.cuda.synchronize()`` on GPU). Slow drifts of machine load hit both halves of a pair
  alike and cancel in the pair's ratio ``candidate_i / baseline_i``.
* **Alternating order.** Even pairs run baseline first, odd pairs candidate first, so an
  order effect (the second call finding warm caches) cancels as well.
* **Warm-up first.** ``warmup`` pairs (1 by default) run and are thrown away, after each
  record has already called its candidate once to check it: they pay lazy imports,
  allocator growth and first-call set-up.
* **Median of paired ratios.** ``ratio`` is the median of the per-pair ratios, robust to the
  odd pair hit by a burst of load.
* **Seeded bootstrap ci95.** ``ci95`` is the 2.5-97.5 % percentile interval of the medians of
  2000 resamples (with replacement) of the pairs, from a numpy generator seeded by ``--seed``
  and the record's name and setting, so the same times give the same interval.
* **Enough repeats.** After ``min_pairs`` pairs, measuring stops as soon as the ci95 lies
  entirely on one side of the target (``decisive``: the interval is narrower than the
  distance to the target) or is narrower than the record's ``precision`` (the target's
  margin, e.g. 0.10 for a ``<= 1.10`` target); otherwise it goes on up to ``max_pairs`` pairs
  or ``max_seconds`` per record (a record whose pairs are so slow that ``min_pairs`` would
  take over twice ``max_seconds`` stops there, after at least 5 pairs). The JSON keeps why it
  stopped (``stop_reason``).

Threads
-------
On CPU the harness runs torch single-threaded by default (``--threads 1``; ``--threads 0``
keeps torch's default). On a shared 2-core machine, torch's two OpenMP threads stall at every
operator's barrier whenever another process holds one core, which made single calls up to
10x slower and per-pair ratios spread from 0.5 to 35 in trials here; one thread gave a spread
of about +-7 %. The thread count is in the JSON (``machine.torch_num_threads``). Ratios with
more threads are higher where the candidate adds Python-side work (hooks) that does not
parallelise; ``docs/performance.md`` shows both.

Targets are checked on the median ratio (``met_ratio``); ``met`` also requires the memory
target where a record has one (``profile_vs_cache``). A missed target is data, not a failure:
the exit status is 0 unless a record errored (1) or the arguments are wrong (2).

GPU mode
--------
``--device cuda`` runs the same records in bfloat16 (``--dtype`` to change) with
synchronised timers and ``torch.cuda.max_memory_allocated`` for memory. Where no GPU is
available (CI), it prints a clear message, writes the JSON with every record marked
``status: "skipped"`` and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import attribution as _attribution  # noqa: F401
from . import patching as _patching  # noqa: F401
from . import path_patching as _path_patching  # noqa: F401
from . import peers as _peers  # noqa: F401
from . import planned as _planned  # noqa: F401 - importing registers the records
from . import records as _records  # noqa: F401
from .peak_measure import peak_memory
from .registry import REGISTRY, Bench, NotAvailable, RecordSpec, Setting, Skipped, make_record
from .timing import N_BOOTSTRAP

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Record names outside checks read from the JSON (all registered; the order of the table).
CONTRACT_NAMES = ("profile_overhead", "profile_vs_handwritten", "peer_nnsight", "profile_vs_cache",
                  "edit_overhead", "sweep_cost", "sweep_shared_prefix", "train_step_overhead",
                  "compression_local_cost", "layer_sweep_shared_prefix",
                  "patching_vs_transformer_lens", "attribution_vs_transformer_lens",
                  "path_patching_vs_transformer_lens")

#: On a catalogue real model a record stops after this many pairs once its hard time budget
#: (2 x max_seconds) is spent: a forward there is seconds (a layer-sweep pair is minutes), and
#: the ci95 of 3 pairs still decides the verdict honestly ("too noisy" when it is wide).
REAL_FLOOR_PAIRS = 3

#: Width and heads of the "wide" model (a seeded GPT-2 with the main model's depth, context and
#: vocabulary), used to show how the cost ratios change with d_model.
WIDE_D_MODEL = 768
WIDE_N_HEADS = 12


def default_settings(wide: bool, real: bool = False) -> list[Setting]:
    """Default mode: the primary setting (seq 128, batch 8), two other sequence lengths (32,
    256), another batch size (2), and the primary workload on a wider model.

    On a catalogue real model (``real``): the primary setting and the two 256-token workloads
    (seq 32 x batch 8, seq 128 x batch 2), no seq 256 and no wide model: a forward there is
    seconds, and the run must stay within about 40 minutes (docs/performance.md)."""
    if real:
        return [Setting(128, 8, primary=True), Setting(32, 8), Setting(128, 2)]
    out = [
        Setting(128, 8, primary=True),
        Setting(32, 8),
        Setting(256, 8),
        Setting(128, 2),
    ]
    if wide:
        out.append(Setting(128, 8, model="wide", d_model=WIDE_D_MODEL))
    return out


def quick_settings() -> list[Setting]:
    """``--quick``: one tiny workload (the smoke test checks the harness, not the scaling)."""
    return [Setting(32, 2, primary=True)]


@dataclass
class Config:
    """Everything that decides what a run measures (stored in the JSON header)."""

    mode: str
    model: str
    device: str
    dtype: str
    warmup: int
    min_pairs: int
    max_pairs: int
    max_seconds: float
    memory: bool
    seed: int
    threads: int
    settings: list[Setting] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    #: Peak memory of each record's baseline and candidate (one subprocess per side) on the
    #: primary setting (default: on for catalogue real models, see benchmarks.peak_memory).
    peak_memory: bool = False
    #: The catalogue name of the model under test ("smollm2-135m", ...) or None (the default
    #: model, a directory or another name); picks model-dependent targets.
    catalogue_model: str | None = None
    #: Why there is no wide setting (None when there is one or it was not asked for).
    wide_note: str | None = None
    #: k-forward baselines timed as one forward x k (catalogue real models; Bench.measure).
    scaled_baselines: bool = False
    #: Fewest pairs before the hard time budget stops a record (catalogue real models: 3).
    real_floor_pairs: int | None = None


class Harness:
    """Loads models and inputs lazily (cached per setting) and runs the registered records."""

    def __init__(self, config: Config, log=None):
        self.config = config
        self.device = torch.device(config.device)
        self.dtype_name = config.dtype
        self.dtype = getattr(torch, config.dtype)
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._models: dict = {}
        self._sources: dict[str, str] = {}
        self._inputs: dict = {}
        self._tmp: str | None = None

    # -- models and inputs ----------------------------------------------
    def source(self, key: str) -> str:
        """What ``load_model`` loads the model ``key`` from (built on first use for "wide")."""
        if key in self._sources:
            return self._sources[key]
        if key == "main":
            src = self.config.model
        elif key == "wide":
            from tl_directional.model.load import build_tiny_hf_model

            cfg = self.model("main").cfg
            spec = {"seed": 0, "n_layers": int(cfg.n_layers), "d_model": WIDE_D_MODEL,
                    "n_heads": WIDE_N_HEADS, "n_ctx": int(cfg.n_ctx), "vocab_size": int(cfg.d_vocab)}
            self._tmp = self._tmp or tempfile.mkdtemp(prefix="tl_directional_bench_")
            path = Path(self._tmp) / f"wide-d{WIDE_D_MODEL}"
            self.log(f"building the wide model (seeded gpt2, {spec})")
            build_tiny_hf_model("gpt2", path, **spec)
            src = str(path)
        else:
            raise ValueError(f"unknown model key {key!r}")
        self._sources[key] = src
        return src

    def load(self, key: str):
        """A freshly loaded model ``key`` (eval mode) on the run's device and dtype."""
        from tl_directional.model.load import load_model

        return load_model(self.source(key), device=self.device, dtype=self.dtype).eval()

    def model(self, key: str):
        if key not in self._models:
            self._models[key] = self.load(key)
        return self._models[key]

    def inputs(self, setting: Setting):
        from .workloads import text_batch

        k = (setting.model, setting.seq, setting.batch)
        if k not in self._inputs:
            self._inputs[k] = text_batch(self.model(setting.model), setting.batch, setting.seq).to(self.device)
        return self._inputs[k]

    def close(self) -> None:
        self._models.clear()
        self._inputs.clear()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # -- running --------------------------------------------------------
    def run_spec(self, spec: RecordSpec) -> list[dict]:
        """All records of one registered spec, one per applicable setting."""
        out: list[dict] = []
        settings = [s for s in self.config.settings if s.model in spec.models]
        if spec.primary_only:
            settings = [s for s in settings if s.primary] or settings[:1]
        for setting in settings:
            seed = self.config.seed * 1_000_003 + zlib.crc32(f"{spec.name}|{setting.label}".encode())
            target, target_source = spec.target_for(self.config.catalogue_model, setting)
            tspec = spec.for_target(target)
            t0 = time.perf_counter()
            try:
                model = self.model(setting.model)
                n_ctx = int(getattr(model.cfg, "n_ctx", setting.seq) or setting.seq)
                if setting.seq > n_ctx:
                    out.append(make_record(tspec, setting, status="skipped", target_source=target_source,
                                           reason=f"seq={setting.seq} > the model's n_ctx={n_ctx}"))
                    continue
                bench = Bench(tspec, setting, model, self.source(setting.model),
                              self.inputs(setting), self, seed, started=t0)
                timing = spec.fn(bench)
                if self.config.peak_memory and setting.primary and setting.model == "main":
                    bench.extra["peak_memory"] = self._peak_memory(spec, setting)
                rec = make_record(tspec, setting, status="ok", timing=timing, extra=bench.extra,
                                  seed=seed, target_source=target_source)
            except NotAvailable as exc:
                primary = next((s for s in settings if s.primary), settings[0])
                rec = make_record(tspec, primary, status="not_available", reason=str(exc),
                                  target_source=target_source)
                out.append(rec)
                self.log(f"{spec.name:24s} not available: {exc}")
                return out
            except Skipped as exc:
                primary = next((s for s in settings if s.primary), settings[0])
                rec = make_record(tspec, primary, status="skipped", reason=str(exc),
                                  target_source=target_source)
                out.append(rec)
                self.log(f"{spec.name:24s} skipped: {exc}")
                return out
            except Exception as exc:  # noqa: BLE001 - one broken record must not hide the rest
                traceback.print_exc(file=sys.stderr)
                rec = make_record(tspec, setting, status="error", target_source=target_source,
                                  reason=f"{type(exc).__name__}: {exc}")
            rec["wall_s"] = time.perf_counter() - t0
            out.append(rec)
            self.log(_progress_line(rec))
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return out


    def _peak_memory(self, spec: RecordSpec, setting: Setting) -> dict:
        """``extra.peak_memory``: both sides' peak in fresh subprocesses (or why not)."""
        try:
            return peak_memory(spec, self.source(setting.model), setting.seq, setting.batch,
                               device=self.config.device, dtype=self.dtype_name,
                               threads=self.config.threads, log=self.log)
        except Exception as exc:  # noqa: BLE001 - reported in the record, never hidden
            return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}


def _progress_line(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['name']:24s} {rec['setting']:28s} {rec['status']}: {rec['reason']}"
    lo, hi = rec["ci95"]
    return (f"{rec['name']:24s} {rec['setting']:28s} ratio {rec['ratio']:.3f} "
            f"[{lo:.3f}, {hi:.3f}] {rec['n_pairs']} pairs, {rec['wall_s']:.0f} s")


# -- machine info ------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


#: The environment variables that pick the CPU kernel path of torch (ATen), MKL and oneDNN
#: (Makefile ``test-kernels``; ``benchmarks.kernel_paths`` sets them per subprocess).
KERNEL_ENV_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_capability() -> str | None:
    """``torch.backends.cpu.get_cpu_capability()`` (e.g. ``"AVX512"``, ``"AVX2"``), None where
    this torch build cannot say."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None


def machine_info(device: str, dtype: str) -> dict:
    """Where and with what the numbers were measured (the JSON header's ``machine``)."""
    from tl_directional.model.load import tl_lane

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "torch_num_threads": torch.get_num_threads(),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_version": torch.__version__,
        "transformer_lens_version": _version("transformer-lens"),
        "transformers_version": _version("transformers"),
        "tl_lane": tl_lane(),
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if cuda else _cpu_model(),
        "cuda_available": torch.cuda.is_available(),
        # which CPU kernels torch, MKL and oneDNN ran (AVX-512 / AMX against AVX2 changes the
        # ratios by several percent): torch's choice and the variables that force another path
        "cpu_capability": cpu_capability(),
        "kernel_env": {k: os.environ.get(k) for k in KERNEL_ENV_VARS},
        "dtype": dtype,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


def model_info(harness: Harness) -> dict:
    """Shape of the main model (from its config), and its source."""
    info: dict = {"source": harness.config.model, "catalogue_name": harness.config.catalogue_model}
    try:
        cfg = harness.model("main").cfg
    except Exception as exc:  # noqa: BLE001
        info["error"] = f"{type(exc).__name__}: {exc}"
        return info
    for k in ("model_name", "original_architecture", "n_layers", "d_model", "n_heads", "d_head",
              "d_mlp", "n_ctx", "d_vocab"):
        v = getattr(cfg, k, None)
        if v is not None:
            info[k] = v if isinstance(v, (int, float, str)) else str(v)
    info["class"] = type(harness.model("main")).__name__
    if "wide" in harness._sources:
        info["wide_d_model"] = WIDE_D_MODEL
    return info


# -- output ------------------------------------------------------------------


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        ci = "-" if r["ci95"] is None else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        rows.append([r["name"], r["setting"] + (" *" if r["primary"] else ""), _fmt(r["ratio"]),
                     ci, r["target_text"].replace("ratio ", ""), met, r.get("verdict") or "-",
                     str(r["n_pairs"] or "-"), r["status"]])
    return rows


HEADER = ["record", "setting", "ratio", "ci95", "target", "met", "verdict", "pairs", "status"]


def format_table(records: list[dict]) -> str:
    """Plain-text table (``*`` marks the primary setting), plus memory lines."""
    rows = [HEADER] + table_rows(records)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += memory_lines(records)
    return "\n".join(lines)


def markdown_table(records: list[dict]) -> str:
    """The same table in Markdown (pasted into docs/performance.md)."""
    rows = table_rows(records)
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    mem = memory_lines(records)
    if mem:
        out += ["", "```", *mem, "```"]
    return "\n".join(out)


def memory_lines(records: list[dict]) -> list[str]:
    lines = []
    for r in records:
        mem = (r.get("extra") or {}).get("memory")
        if not mem:
            continue
        if mem.get("status") != "ok":
            lines.append(f"memory ({r['name']}, {r['setting']}): {mem.get('status')}: {mem.get('reason')}")
            continue
        sizes = ", ".join(f"{m}x={n}" for m, n in zip(mem["multipliers"], mem["n_sequences"], strict=True))
        s = " / ".join(f"{x:.1f}" for x in mem["streaming_peak_increment_mb"])
        n = " / ".join(f"{x:.1f}" for x in mem["naive_peak_increment_mb"])
        lines += [
            f"peak memory increment, MB ({mem['batch_size']}-seq batches of {mem['seq']} tokens; "
            f"sequences {sizes}):",
            f"  streaming profile: {s}   growth {mem['streaming_growth']:.3f}",
            f"  {mem.get('compared_with', 'naive') + ':':18s} {n}   growth {mem['naive_growth']:.3f}",
            f"  target: {mem['target']}: {'met' if mem['met'] else 'NOT met'}",
            f"  method: {mem['method']}; {mem.get('allocator', '')}",
        ]
    return lines


def summary(records: list[dict]) -> dict:
    """Per record name, its primary-setting record's headline numbers."""
    out = {}
    for r in records:
        if r["primary"] and r["name"] not in out:
            out[r["name"]] = {k: r[k] for k in ("setting", "status", "ratio", "ci95", "target",
                                                 "target_op", "met", "met_ratio", "reason")}
    return out


# -- command line ------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run",
                                description="tl-directional benchmark harness (cost ratios).")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny settings, few pairs, no memory subprocesses")
    p.add_argument("--json", metavar="OUT", help="write the records as JSON to OUT")
    p.add_argument("--markdown", metavar="OUT", help="also write the table as Markdown to OUT")
    p.add_argument("--model", default="default",
                   help="'default' (the bundled GPT-2), a catalogue real model ('smollm2-135m', "
                        "'gemma-3-270m') or a model directory: anything load_model takes")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default=None,
                   help="float32 (CPU default) or bfloat16 (CUDA default), float16")
    p.add_argument("--records", default=None,
                   help=f"comma-separated subset of {','.join(REGISTRY)}")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-pairs", type=int, default=None)
    p.add_argument("--max-pairs", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=None,
                   help="time budget per record and setting for the recorded pairs")
    mem = p.add_mutually_exclusive_group()
    mem.add_argument("--memory", dest="memory", action="store_true", default=None,
                     help="measure memory scaling also with --quick")
    mem.add_argument("--no-memory", dest="memory", action="store_false")
    p.add_argument("--no-wide", action="store_true", help="skip the wider-model setting")
    peak = p.add_mutually_exclusive_group()
    peak.add_argument("--peak-memory", dest="peak_memory", action="store_true", default=None,
                      help="peak memory of each record's baseline and candidate (one subprocess "
                           "per side, primary setting); default: on for catalogue real models")
    peak.add_argument("--no-peak-memory", dest="peak_memory", action="store_false")
    p.add_argument("--setting", metavar="SEQxBATCH", default=None,
                   help="measure one workload only, e.g. 64x1 (the scaling family's large models)")
    p.add_argument("--primary-only", action="store_true",
                   help="only the primary setting (no scaling settings)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads on CPU (default 1, see the module docstring; "
                        "0 keeps torch's default)")
    return p.parse_args(argv)


def _usage_error(msg: str) -> None:
    print(f"python -m benchmarks.run: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def make_config(a: argparse.Namespace) -> Config:
    quick = a.quick
    cuda = str(a.device).startswith("cuda")
    dtype = a.dtype or ("bfloat16" if cuda else "float32")
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        _usage_error(f"--dtype {dtype!r} is not a torch dtype")
    ordered = [n for n in CONTRACT_NAMES if n in REGISTRY] + [n for n in REGISTRY if n not in CONTRACT_NAMES]
    names = ordered if a.records is None else [n.strip() for n in a.records.split(",") if n.strip()]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        _usage_error(f"--records has unknown name(s) {unknown}; known: {list(REGISTRY)}")
    if a.threads < 0:
        _usage_error(f"--threads must be >= 0, got {a.threads}")
    catalogue = _check_model_arg(a.model)
    real = catalogue not in (None, "default")
    wide = not a.no_wide and not quick and not real
    wide_note = None
    if real and not a.no_wide and not quick:
        wide_note = (f"no wide setting on {catalogue}: the wide setting is a seeded GPT-2 of the main "
                     "model's depth and vocabulary at d_model 768, which shows width scaling on the "
                     "small default model; on a real model it would time a random model of another "
                     "architecture, not the one under test")
    return Config(
        mode="quick" if quick else "default",
        model=a.model,
        device=a.device,
        dtype=dtype,
        warmup=a.warmup if a.warmup is not None else 1,
        min_pairs=a.min_pairs if a.min_pairs is not None else (2 if quick else 10),
        max_pairs=a.max_pairs if a.max_pairs is not None else (2 if quick else 60),
        max_seconds=a.max_seconds if a.max_seconds is not None else (10.0 if quick else 20.0),
        memory=a.memory if a.memory is not None else not quick and not real,
        seed=a.seed,
        threads=a.threads if a.device == "cpu" else 0,
        settings=_one_setting(a.setting) if a.setting else [
            s for s in (quick_settings() if quick else default_settings(wide, real))
            if s.primary or not a.primary_only],
        records=names,
        peak_memory=a.peak_memory if a.peak_memory is not None else real and not quick,
        catalogue_model=catalogue if real else None,
        wide_note=wide_note,
        scaled_baselines=real,
        real_floor_pairs=REAL_FLOOR_PAIRS if real else None,
    )


def _one_setting(text: str) -> list[Setting]:
    """``--setting 64x1``: one primary workload of 64-token sequences, batch 1."""
    try:
        seq, batch = (int(v) for v in text.lower().split("x"))
    except ValueError:
        _usage_error(f"--setting must be SEQxBATCH with two positive integers, e.g. 64x1; got {text!r}")
    if seq < 2 or batch < 1:
        _usage_error(f"--setting needs seq >= 2 and batch >= 1, got {text!r}")
    return [Setting(seq, batch, primary=True)]


def _check_model_arg(model: str) -> str | None:
    """The catalogue name ``--model`` is (``"default"``, ``"smollm2-135m"``, ...), None for a
    directory or another TransformerLens name; a usage error (exit 2) for a name nothing knows."""
    from tl_directional.model.load import UnknownModelError, catalogue_names, check_model_name

    if model in catalogue_names():
        return model
    if Path(model).expanduser().exists():
        return None
    try:
        check_model_name(model)
    except UnknownModelError as exc:
        _usage_error(exc.describe(f"--model {model!r}"))
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the harness; returns the exit status (0 ok, 1 a record errored)."""
    a = parse_args(argv)
    config = make_config(a)
    previous_threads = torch.get_num_threads()
    if config.threads and config.device == "cpu":
        torch.set_num_threads(config.threads)
    try:
        return _main(a, config, argv)
    finally:
        torch.set_num_threads(previous_threads)


def _main(a: argparse.Namespace, config: Config, argv: list[str] | None) -> int:
    started = time.time()
    specs = [REGISTRY[n] for n in config.records]
    header = {
        "schema_version": SCHEMA_VERSION,
        "harness": "tl-directional benchmarks",
        "mode": config.mode,
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "started_unix": started,
        "machine": machine_info(config.device, config.dtype),
        "config": {**asdict(config), "settings": [s.label + (" (primary)" if s.primary else "")
                                                  for s in config.settings]},
        "timing_method": {
            "pairs": "baseline and candidate timed back to back, order alternating per pair",
            "warmup_pairs": config.warmup,
            "ratio": "median of per-pair ratios candidate/baseline",
            "ci95": f"seeded percentile bootstrap over pairs ({N_BOOTSTRAP} resamples)",
            "stopping": "after min_pairs: stop when ci95 excludes the target or is narrower than "
                        "the record's precision; else up to max_pairs / max_seconds",
        },
        "contract_names": list(CONTRACT_NAMES),
    }

    if config.device.startswith("cuda") and not torch.cuda.is_available():
        msg = (f"benchmarks: --device {config.device} needs a GPU, but torch.cuda.is_available() "
               "is False here (no GPU or a CPU-only torch build). Nothing was measured; every "
               "record is marked status 'skipped'. Exit status 0.")
        print(msg, file=sys.stderr)
        recs = [make_record(s, None, status="skipped", reason="CUDA not available") for s in specs]
        _write_outputs(a, header, recs, started, model=None)
        print(format_table(recs))
        return 0

    harness = Harness(config)
    recs: list[dict] = []
    try:
        model = model_info(harness)
        for spec in specs:
            recs += harness.run_spec(spec)
        _write_outputs(a, header, recs, started, model=model)
    finally:
        harness.close()
    print(format_table(recs))
    print(f"\n{config.mode} mode, {time.time() - started:.0f} s; ratios are candidate/baseline "
          "on the same batch (lower is better).")
    return 1 if any(r["status"] == "error" for r in recs) else 0


def _write_outputs(a, header: dict, recs: list[dict], started: float, model) -> None:
    finished = time.time()
    doc = {**header, "model": model, "finished_unix": finished, "duration_s": finished - started,
           "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
           "summary": summary(recs), "records": recs}
    if a.json:
        path = Path(a.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(_finite(doc), indent=2, default=_json_default, allow_nan=False))
        os.replace(tmp, path)
    if a.markdown:
        Path(a.markdown).write_text(markdown_table(recs) + "\n")


def _finite(o):
    """Strict JSON: non-finite floats become null (``inf`` growth, NaN checks)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_default(o):
    if isinstance(o, (torch.dtype, torch.device, Path)):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return repr(o)


if __name__ == "__main__":
    raise SystemExit(main())
