"""One error base: every error class of the package subclasses ``tld.TLDirectionalError`` and
keeps the built-in class users caught before."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tl_directional as tld

# the built-in each error was before the common base (what ``except`` clauses in the wild catch)
KEEPS = {
    "AccuracySuiteError": ValueError,
    "ArtefactError": ValueError,
    "CarrierShapeError": ValueError,
    "CarrierUnavailableError": ValueError,
    "CalibrationRequiredError": ValueError,
    "WeightingError": ValueError,
    "RandomScaleError": ValueError,
    "AttributionError": ValueError,
    "BootstrapError": ValueError,
    "PatchingInputError": ValueError,
    "PathPatchError": ValueError,
    "RankError": ValueError,
    "StackSplitError": ValueError,
    "SAEError": ValueError,
    "SubspaceError": ValueError,
    "DirectionError": ValueError,
    "DirectionMismatchError": ValueError,
    "ResultError": KeyError,
    "DamagedWeightsError": ValueError,
    "EditSpecError": ValueError,
    "HookRegistryChangedError": RuntimeError,
    "LensInputError": ValueError,
    "ModelArgsError": ValueError,
    "ArtefactLockedError": ValueError,
    "AttentionPatternUnavailableError": RuntimeError,
    "CheckpointError": ValueError,
    "CheckpointMismatch": ValueError,
    "CompatibilityError": ValueError,
    "ConfigMismatchError": ValueError,
    "CorpusIntegrityError": ValueError,
    "EditsAlreadyInstalledError": RuntimeError,
    "NoHookPointsError": TypeError,
    "NonFiniteEditError": ValueError,
    "RenamedArgumentError": TypeError,
    "PretokenisedCorpusError": ValueError,
    "PairedStatsError": ValueError,
    "RealModelError": RuntimeError,
    "SiteResolutionError": ValueError,
    "TokenizerMismatchError": ValueError,
    "UnknownModelError": ValueError,
    "UnsupportedModelError": TypeError,
    "UsageError": Exception,
    "_SideCallMismatch": RuntimeError,
}
# exceptions that are control flow, not errors
NOT_ERRORS = {"StopForward"}


def package_exceptions() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tld.__path__, tld.__name__ + "."):
        if ".data." in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and not issubclass(obj, Warning)
                    and obj.__module__.startswith(tld.__name__ + ".")):
                found[name] = obj
    return found


def test_every_package_error_has_the_one_base():
    found = package_exceptions()
    assert set(KEEPS) | NOT_ERRORS | {"TLDirectionalError"} == set(found), (
        "an error class was added or removed: list it in KEEPS with the built-in it keeps")
    bad = [name for name, cls in found.items()
           if name not in NOT_ERRORS and not issubclass(cls, tld.TLDirectionalError)]
    assert not bad, f"errors without the base tld.TLDirectionalError: {bad}"


def test_every_error_keeps_its_builtin_class():
    found = package_exceptions()
    lost = {name: base.__name__ for name, base in KEEPS.items() if not issubclass(found[name], base)}
    assert not lost, f"errors that no longer subclass what users catch: {lost}"


def test_the_base_catches_a_real_bad_argument():
    """An argument error raised by a public call is caught by the base and by ``ValueError``."""
    from tl_directional.model.load import check_model_name

    for catch in (tld.TLDirectionalError, ValueError):
        try:
            check_model_name("no-such-model-xyz")
        except catch as err:
            assert "no-such-model-xyz" in str(err)
        else:  # pragma: no cover - the call must raise
            raise AssertionError("check_model_name accepted an unknown name")
