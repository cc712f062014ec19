"""The one run pipeline of a measuring study: refuse a dirty tree, load the model and resolve its
sites, name the data stem, write the manifest's header, keep what an earlier run finished
(``--resume``), measure text by text (window batch by window batch), and write the data files
with their manifest atomically after each text.

A study over the protocol's held-out texts subclasses :class:`WindowStudy` and fills in what is
its own (the manifest's study fields, any preparation such as calibration, what ``--resume``
must match, the measurement of one text, the data files); :func:`run_windows` does the rest in
one order for every study. A study that measures another way (the compression grid, setting by
setting) uses :func:`start` alone. Records and manifests are byte for byte what each study wrote
before the pipeline was shared.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studies import common
from studies.realrun import protocol_windows, run_stem, window_records

#: where a run's data files go unless the study is told otherwise (``--data-dir``)
DATA = common.ROOT / "docs" / "results" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the catalogue models are converted locally


@dataclass
class Started:
    """A run past its checks: the code's commit and dirtiness, the loaded model, its resolved
    sites and the wall-clock start (``time.time()``)."""

    commit: str
    dirty: bool
    model: Any
    sites: Any
    t0: float


def start(args, check: Callable[[], int | None] | None = None) -> Started | int:
    """The opening of every measuring run: refuse a dirty ``tl_directional/`` or ``studies/``
    (unless ``args.allow_dirty``), run the study's own argument ``check`` (an exit status stops
    the run), set ``args.threads`` torch threads with gradients off, load ``args.model`` (on
    ``args.device`` where the study has that option, else the CPU) and resolve its sites. Returns :class:`Started`, or the exit status to stop with."""
    import torch

    from tl_directional.model.load import load_model
    from tl_directional.model.sites import resolve_sites

    commit, dirty = common.git_state()
    if (refused := common.refuse_dirty(dirty, args.allow_dirty)) is not None:
        return refused
    if check is not None and (rc := check()) is not None:
        return rc
    device = getattr(args, "device", "cpu")
    if (why := device_problem(device)) is not None:
        print(f"error: --device {device}: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(args.model, device=device)
    return Started(commit, dirty, model, resolve_sites(model, warn=False), t0)


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot take a model here (not a torch device, or a CUDA / MPS device this
    torch build or machine does not have), or None."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        return f"not a torch device ({exc}); pass cpu, cuda or cuda:N"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "this torch has no CUDA device (a CPU build, or no GPU); run with --device cpu"
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"only {torch.cuda.device_count()} CUDA device(s); pass cuda:0 to cuda:{torch.cuda.device_count() - 1}"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "no MPS device here; run with --device cpu"
    return None


def window_batches(batch, batch_size: int, t1: float, what: str = "windows", prefix: str = "  ") -> Iterator:
    """``(first window, part)`` for each ``batch_size`` slice of ``batch`` (a token batch); after
    each, one progress line (``windows 0-7 done (12 s)``, seconds since ``t1``)."""
    for i in range(0, len(batch), batch_size):
        part = batch.slice(i, i + batch_size)
        yield i, part
        print(f"{prefix}{what} {i}-{i + part.tokens.shape[0] - 1} done ({time.time() - t1:.0f} s)", flush=True)


def record_windows(model, batch, sets, text: str, batch_size: int, t1: float, spent: dict | None = None) -> list[dict]:
    """The per-window records (:func:`studies.realrun.window_records`) of every window of
    ``batch`` under the baseline and each setting of ``sets``, batch by batch with progress."""
    records: list[dict] = []
    for i, part in window_batches(batch, batch_size, t1):
        records += window_records(model, part, sets, text, i, spent)
    return records


class WindowStudy:
    """A measuring study over the held-out texts; :func:`run_windows` runs it.

    Set :attr:`prefix` (the data stem's), :attr:`texts` (``{name: (description, file)}``) and
    override :meth:`header`, :meth:`measure_text` and :meth:`files`; the other hooks have the
    common defaults. ``self.run`` (:class:`Started`) and ``self.manifest`` are set before any
    hook but :meth:`check` runs."""

    prefix = ""
    texts: dict[str, tuple[str, str]] = {}
    #: the count the closing ``wrote ...`` line names, and its unit
    unit = "records"
    #: each text records the commit and command that measured it (a resumed run stitches texts)
    text_provenance = True
    #: the manifest lists the distinct commits of its texts (``commits``) when there are several
    record_commits = True
    #: write the data after every text (a stopped run keeps what it finished); else once, at the end
    write_each_text = True

    def __init__(self, args):
        self.args = args
        self.data = Path(args.data_dir) if getattr(args, "data_dir", "") else DATA
        self.run: Started
        self.manifest: dict = {}

    def check(self) -> int | None:
        """Arguments the run cannot start with: an exit status (after an ``error:`` line)."""
        return None

    def stem(self) -> str:
        """The data files' stem: ``<prefix>_<model>[_len<seq>][_<tag>]``."""
        return run_stem(self.prefix, self.args)

    def header(self) -> dict:
        """The manifest before any text: provenance, the study's fields, ``texts: {}``,
        ``complete: False``, ``files: {}``."""
        raise NotImplementedError

    def prepare(self) -> int | None:
        """Work before the texts (calibration, settings): an exit status stops the run."""
        return None

    def resume(self, stem: str) -> str | None:
        """Keep the texts an earlier run of ``stem`` finished (copy them into the manifest and
        reload their rows); the reason it cannot (``"holds other settings; ..."``) otherwise."""
        return "cannot resume this study; rerun it whole"

    def windows(self, text: str, rel: str):
        """The text's protocol windows, or ``None`` after an ``error:`` line."""
        return protocol_windows(self.run.model, text, rel, self.args)

    def complete_texts(self) -> list[str]:
        """The texts a complete run holds."""
        return list(self.args.texts)

    def measure_text(self, text: str, batch) -> dict | int:
        """Measure one text (keeping its rows on ``self``): the text's manifest fields after
        ``windows`` (``seconds`` and the study's own), or an exit status to stop with."""
        raise NotImplementedError

    def files(self) -> dict[str, bytes]:
        """The data files' contents so far, by name."""
        raise NotImplementedError

    def count(self) -> int:
        """How many :attr:`unit` the files hold (for the closing line)."""
        raise NotImplementedError

    def checkpoint(self, text: str, progress: dict) -> None:
        """Write the data so far in the middle of ``text`` (a stopped run keeps a part of a long
        text): the files as they stand, the manifest with ``partial[text] = progress`` (the study's
        own account of what of ``text`` is done, which its :meth:`resume` reads back) and still
        incomplete. The entry goes when ``text`` finishes; readers of the data skip a text that is
        only in ``partial``."""
        self.manifest.setdefault("partial", {})[text] = progress
        self.manifest["complete"] = False
        _write(self, self.stem())


def _finish_text(study: WindowStudy, text: str, batch, info: dict) -> None:
    manifest, (desc, rel) = study.manifest, study.texts[text]
    entry = {"description": desc, "file": rel, "sha256": common.sha256_bytes((common.ROOT / rel).read_bytes()),
             "windows": len(batch), **info}
    if study.text_provenance:
        entry |= {"commit": manifest["commit"], "command": manifest["command"]}
    manifest["texts"][text] = entry
    if text in manifest.get("partial", {}):  # its checkpoint is superseded by the finished text
        del manifest["partial"][text]
        if not manifest["partial"]:
            del manifest["partial"]
    manifest["seconds"] = round(time.time() - study.run.t0, 1)
    manifest["complete"] = set(study.complete_texts()) <= set(manifest["texts"])
    if study.record_commits:
        commits = list(dict.fromkeys(v.get("commit", manifest["commit"]) for v in manifest["texts"].values()))
        if len(commits) > 1:
            manifest["commits"] = commits


def _write(study: WindowStudy, stem: str) -> None:
    common.write_data(study.data, study.files(), study.manifest, f"{stem}.manifest.json")
    print(f"wrote {study.data / stem}.* ({study.count()} {study.unit})", flush=True)


def run_windows(study: WindowStudy) -> int:
    """Run ``study`` (:class:`WindowStudy`) through the pipeline; returns the exit status (0,
    or 2 after an ``error:`` line: a dirty tree, bad arguments, a text too short, a ``--resume``
    that does not match)."""
    started = start(study.args, study.check)
    if isinstance(started, int):
        return started
    study.run = started
    stem = study.stem()
    study.manifest = study.header()
    if (rc := study.prepare()) is not None:
        return rc
    if getattr(study.args, "resume", False) and (study.data / f"{stem}.manifest.json").is_file():
        if (why := study.resume(stem)) is not None:
            print(f"error: --resume: {stem} {why}", file=sys.stderr)
            return 2
        print(f"resuming {stem}: keeping {', '.join(study.manifest['texts'])}", flush=True)
    for text in study.args.texts:
        if text in study.manifest["texts"]:
            continue
        if (batch := study.windows(text, study.texts[text][1])) is None:
            return 2
        info = study.measure_text(text, batch)
        if isinstance(info, int):
            return info
        _finish_text(study, text, batch, info)
        if study.write_each_text:
            _write(study, stem)
    if not study.write_each_text:
        _write(study, stem)
    return 0
