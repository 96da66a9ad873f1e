"""The ``figures`` command's pipeline: every figure of the paper, drawn and written with its sidecar.

Each figure ``NAME`` of :data:`~variance_lab.paper.catalog.ALL_FIGURES` is written in the chosen
formats (default ``NAME.pdf``, vector, and ``NAME.png``; also ``svg`` and ``eps``) with
``NAME.csv`` (the tidy data drawn, :func:`variance_lab.paper.frames.figure_data`) and a JSON
sidecar ``NAME.json`` holding every parameter (grids, family, seed, n), the style, the package
and library versions (:func:`variance_lab.provenance.versions`) and the SHA-256 of the data file
(:func:`variance_lab.provenance.text_sha256`). :func:`make_all` writes them all;
:func:`from_sidecar` (``variance-lab figures --from-sidecar NAME.json``) rebuilds a figure from
its sidecar alone; :func:`variance_lab.paper.compare.check` (``--check``) rebuilds into a
temporary folder and compares the data number by number, writing nothing. The drawing itself is
:mod:`variance_lab.report.figures`'.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from variance_lab import __version__
from variance_lab._atomic import atomic_write
from variance_lab.paper.catalog import ALL_FIGURES, EXPERIMENT_FIGURE, FIGURES, caption, default_params
from variance_lab.paper.frames import figure_data
from variance_lab.progress import progress_steps
from variance_lab.provenance import FIGURE_VERSIONS, read_json_object, text_sha256, versions, write_sidecar
from variance_lab.report import (
    clip_figure,
    corrections_figure,
    method_figures,
    probmask_figure,
    threshold_figure,
)
from variance_lab.report import figures as plots
from variance_lab.report import style as report_style
from variance_lab.simulate import Engine, using_engine

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_STYLE",
    "FORMATS",
    "QUICK_PNG_DPI",
    "draw",
    "from_sidecar",
    "make_all",
    "make_figure",
    "publish",
    "read_figure_sidecar",
    "save_figure",
]

#: PNG resolution (dots per inch) with ``--quick`` (:data:`variance_lab.report.style.PNG_DPI` otherwise).
QUICK_PNG_DPI = 100
SIDECAR_VERSION = 2
#: Formats ``save_figure`` can write; the default is vector PDF and PNG.
FORMATS = ("pdf", "png", "svg", "eps")
DEFAULT_FORMATS = ("pdf", "png")
#: Style of the command's figures (:func:`variance_lab.report.style.use`).
DEFAULT_STYLE = "paper"


def _histogram_title(params: dict) -> str:
    n = f"{int(params['n']):,}".replace(",", "{,}")
    return f"{params['family']}, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$; $n = {n}$ draws"


def draw(name: str, data: pd.DataFrame, params: dict, *, style=None):
    """Draw figure ``name`` from its data; returns the :class:`~matplotlib.figure.Figure`.

    ``style`` as for :func:`variance_lab.report.style.use` (``None``: the caller's rcParams;
    the command draws with :data:`DEFAULT_STYLE`).
    """
    if name == "variance_vs_T":
        return plots.variance_panels(data, n=params.get("n"), style=style)
    if name == "ratio_vs_T":
        return plots.ratio_vs_T(data, style=style)
    if name.startswith("heatmap_"):
        return plots.heatmap(data, params["statistic"], T=params["T"], style=style)
    if name == "decay_boundary":
        return plots.decay_boundary(data, tuple(params["T"]), style=style)
    if name == "approx_error":
        return plots.approx_error(data, style=style)
    if name == "mc_frontier":
        return plots.mc_frontier(data, params["n"], target=params["target"], style=style)
    if name == "ess_vs_T":
        return plots.ess_vs_T(data, n=params.get("n") or None, style=style)
    if name == "log_histograms":
        return plots.log_histograms(data, title=_histogram_title(params), style=style)
    if name == "corrections_vs_T":
        title = f"{params['family']} ratios, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$"
        title += ": closed form"
        if params.get("n"):
            title += f" and Monte Carlo ($n = {int(params['n']):,}$ draws)".replace(",", "{,}")
        return corrections_figure.corrections_vs_T(
            data,
            title=title,
            style=style,
            experiment_title="bf16 experiment, per length bucket: measured and lognormal fit",
            level=float(params.get("ci", 0.95)),
        )
    if name == "clip_fractions":
        title = f"{Path(params['data']).name}: observed against predicted clip fractions per length bucket"
        return clip_figure.clip_figure(data, level=float(params["level"]), style=style, title=title)
    if name == "thresholds":
        title = f"{params['family']} ratios, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$"
        return threshold_figure.threshold_figure(data, title=title, style=style)
    if name == "prob_masks":
        title = (
            f"(a) log-odds shift of the {params['family']} family, $\\mu={params['mu']:g}$, "
            f"$\\sigma^2={params['sigma2']:g}$; (b, c) {Path(params['data']).name}, ratio {params['ratio']}"
        )
        if params.get("cppo_spec"):
            a, b = params["cppo_token_prob"]
            title += f"; (d) the same family at each $\\sigma^2$, $q \\sim \\mathrm{{Beta}}({a:g}, {b:g})$"
        return probmask_figure.prob_mask_figure(data, title=title, style=style)
    if name in ("sign_weights", "vcpo_ess", "speed_bounds"):
        return _method_figure(name, data, params, style)
    raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")


def _method_figure(name: str, data: pd.DataFrame, params: dict, style):
    """Draw one of the 2025-26 methods' figures (:mod:`variance_lab.report.method_figures`)."""
    if name == "speed_bounds":
        return method_figures.bounds_figure(data, style=style)
    title = f"{params['family']} ratios, $\\mu={params['mu']:g}$, $\\sigma^2={params['sigma2']:g}$"
    if name == "vcpo_ess":
        return method_figures.vcpo_figure(data, title=title, style=style)
    run = Path(params["data"]).name.split(".")[0].removeprefix("smollm2_") if params.get("data") else ""
    data_title = f"{run}, {params['ratio']} ratio" if run else ""
    return method_figures.sign_figure(data, title=title, data_title=data_title, style=style)


def make_figure(
    name: str, params: dict | None = None, *, quick: bool = False, engine: Engine | None = None, style=None
):
    """Compute and draw one figure.

    Parameters
    ----------
    name : str
        One of :data:`FIGURES`.
    params : dict, optional
        Parameters (default: :func:`default_params`); a sidecar's ``params`` reproduce its figure.
    quick : bool
        Use the quick defaults (when ``params`` is not given).
    engine : Engine, optional
        Runs the Monte Carlo parts (default: threads on all cores; does not change results).
    style : None, str or dict
        As for :func:`draw`.

    Returns
    -------
    (Figure, DataFrame, dict)
        The figure, its data and the parameters used.
    """
    params = default_params(name, quick=quick) if params is None else dict(params)
    data = figure_data(name, params, engine=engine)
    return draw(name, data, params, style=style), data, params


# --------------------------------------------------------------------------- files
def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _style_name(style) -> str | None:
    """How the sidecar records ``style``: its name, or the path of a style file."""
    if style is None or isinstance(style, str | os.PathLike):
        return None if style is None else str(style)
    raise ValueError(f"style must be a style name or file, got {style!r}")


def _sidecar(name: str, params: dict, data_text: str, quick: bool, dpi: int, formats, style) -> dict:
    files = {ext: f"{name}.{ext}" for ext in formats}
    return {
        "sidecar_version": SIDECAR_VERSION,
        "figure": name,
        "description": caption(name),
        "params": params,
        "seed": params.get("seed"),
        "n": params.get("n", 0),
        "monte_carlo": bool(params.get("n")) and "mc_T" in params,
        "quick": quick,
        "style": _style_name(style),
        "version": __version__,
        "versions": versions(FIGURE_VERSIONS),
        "files": {**files, "data": f"{name}.csv"},
        "png_dpi": dpi,
        "data_sha256": text_sha256(data_text),
        "reproduce": f"variance-lab figures --from-sidecar {name}.json --out DIR",
    }


def _check_formats(formats) -> tuple[str, ...]:
    formats = tuple(DEFAULT_FORMATS if formats is None else formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"formats must be a non-empty subset of {', '.join(FORMATS)}, got {list(formats)!r}")
    return formats


def save_figure(
    name: str,
    fig,
    data: pd.DataFrame,
    params: dict,
    out: str | os.PathLike,
    *,
    quick: bool = False,
    formats=None,
    dpi: int | None = None,
    style=DEFAULT_STYLE,
) -> list[Path]:
    """Write ``NAME.csv``, the images in ``formats`` and the sidecar ``NAME.json`` to ``out``.

    Files are written atomically and reproducibly (no creation dates). ``dpi`` is the PNG
    resolution (default :data:`~variance_lab.report.style.PNG_DPI`, :data:`QUICK_PNG_DPI` when
    ``quick``); ``style`` is recorded in the sidecar (the style the figure was drawn with).
    """
    formats = _check_formats(formats)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data_text = data.to_csv(index=False)
    csv = out / f"{name}.csv"
    _write_text(csv, data_text)
    dpi = int(dpi) if dpi else (QUICK_PNG_DPI if quick else report_style.PNG_DPI)
    images = plots.write_images(fig, out, name, formats, dpi)
    sidecar = _sidecar(name, params, data_text, quick, dpi, formats, style)
    side = write_sidecar(out / f"{name}.json", sidecar)
    return [csv, *images, side]


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _build(name: str, out: Path, params: dict | None, *, quick, engine, formats, dpi, style) -> list[Path]:
    """Compute, draw, save and close one figure (``params``: a sidecar's, or the defaults)."""
    if name == EXPERIMENT_FIGURE:  # drawn from the shipped data set (variance_lab.experiment)
        from variance_lab.experiment.figure import save_experiment_figure

        p = params or {"n_boot": 200 if quick else 1000, "seed": 0}
        return save_experiment_figure(
            out,
            n_boot=int(p["n_boot"]),
            seed=int(p["seed"]),
            formats=formats,
            dpi=dpi,
            style=style,
            quick=quick,
        )
    with report_style.use(style):
        fig, data, used = make_figure(name, params, quick=quick, engine=engine, style=None)
        try:
            return save_figure(name, fig, data, used, out, quick=quick, formats=formats, dpi=dpi, style=style)
        finally:
            _close(fig)


def make_all(
    out: str | os.PathLike,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    engine: Engine | None = None,
    progress: bool | None = None,
    formats=None,
    dpi: int | None = None,
    style=DEFAULT_STYLE,
) -> list[Path]:
    """Regenerate figures from scratch into ``out``; returns the files written.

    Parameters
    ----------
    out : str or Path
        Output folder (created when missing; its parent must exist). Every figure is built
        in a temporary folder beside it and moved into ``out`` only once all are done
        (:func:`publish`): an interrupted or failed run leaves ``out`` as it was.
    quick : bool
        Small grids and few draws (minutes for every figure; for previews and tests).
    only : sequence of str, optional
        A subset of :data:`ALL_FIGURES`.
    engine : Engine, optional
        Runs the Monte Carlo parts (default: threads on all cores; one engine for every figure).
    progress : None, True or False
        A bar over the figures on standard error, kept at the end
        (:func:`variance_lab.progress.progress_steps`): ``None`` where someone watches, after a
        second; ``True`` at once; ``False`` none.
    formats : sequence of str, optional
        Image formats, a subset of :data:`FORMATS` (default :data:`DEFAULT_FORMATS`).
    dpi : int, optional
        PNG resolution (default :data:`~variance_lab.report.style.PNG_DPI`; :data:`QUICK_PNG_DPI`
        when ``quick``).
    style : None, str or path
        Matplotlib style to draw with (default :data:`DEFAULT_STYLE`, the package's paper style).
    """
    formats = _check_formats(formats)
    _style_name(style)
    names = list(ALL_FIGURES if only is None else only)
    for name in names:
        if name != EXPERIMENT_FIGURE:
            default_params(name)  # validates the name
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is not a folder")
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    build = out.parent / f".{out.name}.building.{os.getpid()}.{secrets.token_hex(4)}"
    build.mkdir()  # the usual permissions (0777 & ~umask), kept when renamed to out
    try:
        written: list[Path] = []
        with (
            using_engine(engine) as eng,
            progress_steps(progress, len(names), "figures", unit="figure", leave=True) as step,
        ):
            for name in names:
                written += _build(
                    name, build, None, quick=quick, engine=eng, formats=formats, dpi=dpi, style=style
                )
                step()
        return publish(build, out, written)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def publish(build: Path, out: Path, written: Sequence[Path]) -> list[Path]:
    """Move the files ``written`` into ``build`` to ``out``: the last step of :func:`make_all`.

    A new ``out`` is the renamed ``build`` folder (one atomic step); into an existing
    ``out`` each file is moved with :func:`os.replace` (atomic per file), after every
    figure was built, so an interrupted run never leaves a partial folder or half a figure.
    """
    rel = [Path(p).relative_to(build) for p in written]
    if not out.exists():
        os.replace(build, out)
    else:
        for r in rel:
            (out / r).parent.mkdir(parents=True, exist_ok=True)
            os.replace(build / r, out / r)
    return [out / r for r in rel]


def read_figure_sidecar(path: str | os.PathLike) -> dict:
    """Read a figure sidecar's contents; ``ValueError`` naming the file when it is not one."""
    path = Path(path)
    sidecar = read_json_object(path, "a figure sidecar")
    try:
        name, _ = sidecar["figure"], sidecar["params"]
    except KeyError as exc:
        raise ValueError(f"{str(path)!r} is not a figure sidecar: {exc}") from None
    if name not in ALL_FIGURES:
        raise ValueError(f"{str(path)!r}: unknown figure {name!r}; choose from {', '.join(ALL_FIGURES)}")
    return sidecar


def _sidecar_formats(sidecar: dict) -> tuple[str, ...]:
    files = sidecar.get("files", {})
    return tuple(ext for ext in FORMATS if ext in files) or DEFAULT_FORMATS


def from_sidecar(
    path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    engine: Engine | None = None,
    formats=None,
    dpi: int | None = None,
    style=None,
) -> list[Path]:
    """Rebuild the figure described by a sidecar JSON into ``out`` (default: its folder).

    Formats, PNG resolution and style default to the sidecar's own (older sidecars without
    a style: :data:`DEFAULT_STYLE`); every figure of :data:`ALL_FIGURES` can be rebuilt.
    """
    path = Path(path)
    sidecar = read_figure_sidecar(path)
    name, params = sidecar["figure"], sidecar["params"]
    style = sidecar.get("style", DEFAULT_STYLE) if style is None else style
    return _build(
        name,
        path.parent if out is None else Path(out),
        params,
        quick=bool(sidecar.get("quick", False)),
        engine=engine,
        formats=_sidecar_formats(sidecar) if formats is None else formats,
        dpi=dpi or sidecar.get("png_dpi"),
        style=style,
    )
