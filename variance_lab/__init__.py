"""variance_lab: Monte Carlo variance analysis of sequence-level importance ratios.

The direct product of per-token ratios, P_T, against GSPO's geometric mean G_T = P_T**(1/T).
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("variance_lab")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

from variance_lab.families import FAMILIES, Family, Gamma, LogNormal, TwoPoint, get_family

__all__ = ["FAMILIES", "Family", "Gamma", "LogNormal", "TwoPoint", "__version__", "get_family", "theory"]


def __getattr__(name: str):
    """Import :mod:`variance_lab.theory` on first use (PEP 562).

    It loads pandas, which building the command line's parser does not need.
    """
    if name == "theory":
        return import_module(f"{__name__}.theory")  # binds the package's ``theory`` attribute too
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """List the module's names, the not yet imported ones included."""
    return sorted(set(globals()) | set(__all__))
