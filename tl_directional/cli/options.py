"""What the commands share: model / text / output-directory arguments checked before any work,
the option parsers, and the argparse parser with the CLI's one-line error format."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import USER_ERRORS, UsageError


def _check_model_arg(name, option: str) -> None:
    """Fail at once, offline, on a ``--model`` / ``--dense`` value that cannot load: a path
    that does not exist, or a name that is neither a catalogue entry nor a TransformerLens name."""
    from ..io.locks import recover_interrupted_swap
    from ..model.load import UnknownModelError, catalogue_names, check_model_name
    from ..model.load.loader import looks_like_path

    text = str(name)
    if text not in catalogue_names():
        recover_interrupted_swap(Path(text).expanduser())  # a compress --out killed mid-swap
    if Path(text).expanduser().exists() or text in catalogue_names():
        return
    if looks_like_path(text):
        raise UsageError(f"{option} {text} does not exist; pass an existing Hugging Face model directory, "
                         f"or a catalogue name ({', '.join(catalogue_names())}; see `tl-directional models`)")
    try:
        check_model_name(text)
    except UnknownModelError as exc:
        raise UsageError(exc.describe(f"{option} {text}")) from None


def _load_model_arg(name: str, option: str = "--model"):
    """``load_model(name)`` with the option named in any error."""
    from ..model.load import load_model

    _check_model_arg(name, option)
    try:
        return load_model(name)
    except USER_ERRORS as exc:
        refused = _refused_pickle(exc)
        if refused is not None:  # transformers 4 wraps it in an OSError about TF checkpoints
            raise UsageError(f"{option} {name} cannot be loaded: {_loading_failure(refused)}") from exc
        hint = ""
        if name != "default" and not Path(name).expanduser().exists() and not any(c in name for c in "/\\.~"):
            hint = (" (no such directory; a TransformerLens model name needs the hub or a warm HF "
                    "cache: pass a local HF model directory, or 'default' for the bundled model)")
        raise UsageError(f"{option} {name}: {' '.join(str(exc).split())}{hint}") from exc
    except Exception as exc:  # transformers / safetensors / torch raise their own types (a
        # wrong-shaped tensor, a pickled .bin that is refused): still the CLI's one error line
        raise UsageError(f"{option} {name} cannot be loaded: {_loading_failure(exc)}") from exc


def _refused_pickle(exc: BaseException) -> BaseException | None:
    """The ``pickle.UnpicklingError`` behind ``exc`` (its causes and contexts), if any."""
    import pickle

    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, pickle.UnpicklingError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _loading_failure(exc: BaseException) -> str:
    """What a loader's own exception means for the user, in one line."""
    import pickle

    text = " ".join(str(exc).split())
    if isinstance(exc, pickle.UnpicklingError):
        return ("its pickled weight file (pytorch_model.bin) is refused by torch's safe loader and was not "
                f"executed ({text[:160]}...); load it only from a trusted source and save it as "
                "model.safetensors")
    if "mismatched_sizes" in text or "size mismatch" in text:
        return ("a weight tensor's shape does not match the model's config.json (transformers: "
                f"{text[:300]}); the weights are damaged or belong to another model: copy or write it again")
    return (f"{type(exc).__name__}: {text[:600]}; check that it is a complete, undamaged Hugging Face "
            "model directory")


#: The output policy of every command that writes a directory: it may write into a directory
#: that is absent, empty, or a previous output of the same command (its manifest says so);
#: --force also replaces another tl-directional command's output; a directory holding files
#: the library did not write, the current / home directory, a root or an ancestor of the
#: current directory are always refused (tl_directional.io.outputs.check_output_path).
_OUTPUT_KINDS = {"profile": "profile", "sweep": "sweep", "report": "report",
                 "compress-check": "compress-check-report", "compress": "compressed-model"}
#: Files an output of that kind held before outputs carried a manifest.
_LEGACY_NAMES = {
    "sweep": frozenset({"sweep.csv", "sweep.html", "sweep.progress.json"}),
    "profile": frozenset({"metadata.json"} | {f"{t}.{f}" for t in ("residual", "value") for f in ("csv", "parquet")}),
}


@contextmanager
def _claim_out(path: str, command: str, force: bool, option: str = "--out") -> Iterator[Path]:
    """Check ``path`` against the output policy before any work is done and hold its lock
    for the whole run (:func:`tl_directional.io.outputs.claim_output`): a second writer is
    refused at start, never overwritten at the end. Yields the path as the user gave it."""
    from ..io.outputs import claim_output

    with claim_output(path, _OUTPUT_KINDS[command], force=force, force_hint="pass --force",
                      command=f"tl-directional {command}", legacy_names=_LEGACY_NAMES.get(command, frozenset()),
                      argument=option):
        yield Path(path)


def _float_list(text: str) -> list[float]:
    """Parse ``"-1,0,0.5"`` (negative values included) into floats."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _int_at_least(lowest: int, expected: str):
    """An argparse ``type``: an integer >= ``lowest``, else a usage error saying ``expected``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "an integer >= 0")


def _layer_sets(text: str, n_layers: int | None = None) -> list:
    """``--layers``' layer sets (:func:`tl_directional.evaluate.sweeps.edit_spec.layer_sets`); a
    mistake is a :class:`UsageError` (one ``error:`` line)."""
    from ..evaluate.sweeps.edit_spec import layer_sets

    try:
        return layer_sets(text, n_layers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_spaces(text: str) -> list[str]:
    from ..edit import EDIT_SPACES

    spaces = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in spaces if s not in EDIT_SPACES]
    if bad or not spaces:
        raise UsageError(f"--space {text!r}: unknown space {bad[0] if bad else '(none)'}; choose from {', '.join(sorted(EDIT_SPACES))}")
    return spaces


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error format (exit status 2, as argparse's own)."""

    def error(self, message):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class _DefaultsHelp(argparse.HelpFormatter):
    """Shows an option's default in its help, unless it is None / False or already stated."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        default = action.default
        if isinstance(default, list):
            default = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        return f"{text} (default: {default})"


_HELP = {
    "text": "UTF-8 text file (default: the bundled held-out KJV slice)",
    "max_sequences": "at most this many sequences of the text",
    "seq_len": "tokens per sequence, BOS included (at most the model's n_ctx)",
    "batch_size": "sequences per forward pass",
    "quiet": "no progress bars",
    "force": "replace the output directory even when it holds another command's output or other files "
             "(without it, only an absent, empty or same-command directory is written)",
}


def _model_help() -> str:
    from ..model.load import catalogue_names

    real = ", ".join(n for n in catalogue_names() if n != "default")
    return (f"a catalogue name: 'default' (the bundled model) or a real model ({real}; "
            "`tl-directional models` lists them); a local HF model directory; or a TransformerLens "
            "model name such as gpt2 (needs the hub). Any other name fails at once")


def _common(p, *, max_sequences: int, seq_len: int) -> None:
    p.add_argument("--model", default="default", help=_model_help())
    p.add_argument("--text", default=None, help=_HELP["text"])
    p.add_argument("--max-sequences", type=_positive_int, default=max_sequences, help=_HELP["max_sequences"])
    p.add_argument("--seq-len", type=_positive_int, default=seq_len, help=_HELP["seq_len"])
    p.add_argument("--batch-size", type=_positive_int, default=8, help=_HELP["batch_size"])


def _load_checked(path, argument: str):
    """Load a model for the CLI; a missing, corrupt or truncated file is a user error
    (exit 2) naming the argument and the file, never the gate's FAIL status."""
    from ..io.atomic import ArtefactError
    from ..io.model_files import check_model_dir
    from ..model.load import check_model_weights, load_model

    _check_model_arg(path, argument)
    check_model_dir(path, argument)
    if Path(path).is_dir():  # damaged weights are exit 2 naming the option, never a gate result
        check_model_weights(path, argument)
    try:
        return load_model(path)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError):
        raise
    except Exception as err:  # transformers / safetensors / tokenizers raise their own types
        raise ArtefactError(f"{argument} {path} cannot be loaded ({type(err).__name__}: {err}); "
                            "check that it is a complete Hugging Face model directory") from None

