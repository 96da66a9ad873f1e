"""variance_lab: Monte Carlo variance analysis of sequence-level importance ratios.

The direct product of per-token ratios, P_T, against GSPO's geometric mean G_T = P_T**(1/T).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("variance_lab")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

from variance_lab._lazy import lazy_exports
from variance_lab.families import FAMILIES, Family, Gamma, LogNormal, TwoPoint, get_family

__all__ = ["FAMILIES", "Family", "Gamma", "LogNormal", "TwoPoint", "__version__", "get_family", "theory"]


#: ``theory`` loads pandas, which building the command line's parser does not need.
__getattr__, __dir__ = lazy_exports(__name__, {"theory": None})
