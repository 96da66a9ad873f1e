"""Progress bars: one helper, one meaning of ``progress=None``, ``True`` and ``False``.

Every function of the package that can show a bar takes ``progress=`` and hands it to
:func:`progress_bar`, so the argument means the same everywhere:

``None`` (auto, the default)
    A bar where someone watches it (standard error a terminal, or a Jupyter kernel), shown
    only once the work has taken :data:`DELAY_S` seconds: short work shows nothing, and a
    log file or a pipe gets no bar.
``True``
    A bar at once, wherever standard error goes (a log file gets tqdm's text lines).
``False``
    No bar.

A bar goes to standard error (a widget in a notebook with ``ipywidgets``), never to standard
output, and disappears when the work is done (tqdm's ``leave=False``), so that the command
line's output and an executed notebook's cells stay as they were.

Long runs that report in lines of text instead of a bar (the language-model experiment's
``progress=`` callable) use :func:`ticker`, which says ``what: done/total sequences`` now and then.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

__all__ = [
    "DELAY_S",
    "check_progress",
    "progress_bar",
    "progress_steps",
    "seconds_since",
    "ticker",
    "watched",
]

#: Seconds before an automatic (``progress=None``) bar appears.
DELAY_S = 1.0


def check_progress(progress) -> bool | None:
    """Return ``progress`` if it is ``None``, ``True`` or ``False``; else raise ``ValueError``."""
    if progress is None or isinstance(progress, bool):
        return progress
    raise ValueError(f"progress must be None (auto), True or False, got {progress!r}")


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython loaded, with a kernel app)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:  # pragma: no cover - a stub module
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def watched() -> bool:
    """Whether someone watches standard error: a terminal, or a Jupyter notebook's output."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a closed or replaced stream
        pass
    return _in_notebook()


def progress_bar(progress, total: int, desc: str, *, unit: str = "it", unit_scale: bool = False, **options):
    """Return a tqdm bar over ``total`` units of work, or ``None`` when there is to be none.

    Parameters
    ----------
    progress : None, True or False
        The module docstring's meaning: ``None`` a bar after :data:`DELAY_S` where someone
        watches (:func:`watched`), ``True`` a bar at once, ``False`` none.
    total : int
        Units of work.
    desc : str
        What the bar says.
    unit : str
        The unit's name.
    unit_scale : bool
        tqdm's ``unit_scale`` (``1.2M`` instead of ``1200000``).
    **options
        Further tqdm options (``initial``, ``dynamic_ncols``).

    Returns
    -------
    tqdm or None
        A notebook widget in a notebook (text where ``ipywidgets`` is missing), tqdm's text bar
        on standard error elsewhere; ``None`` for ``False`` and for ``None`` where nobody watches.
    """
    if check_progress(progress) is False or (progress is None and not watched()):
        return None
    from tqdm import auto, std

    options = {
        "total": total,
        "desc": desc,
        "unit": unit,
        "unit_scale": unit_scale,
        "delay": DELAY_S if progress is None else 0.0,
        "leave": False,
        **options,
    }
    if _in_notebook():
        try:
            return auto.tqdm(**options)
        except ImportError:  # a notebook without ipywidgets: the widget cannot be built, use text
            pass
    return std.tqdm(file=sys.stderr, **options)


@contextlib.contextmanager
def progress_steps(progress, total: int, desc: str, **options) -> Iterator[Callable[..., None]]:
    """Open :func:`progress_bar` for the ``with`` block; yield ``update(n=1)``, closing the bar at its end.

    Without a bar ``update`` does nothing, so the caller counts its steps the same way either
    way. ``options`` as in :func:`progress_bar`.
    """
    bar = progress_bar(progress, total, desc, **options)
    if bar is None:
        yield lambda n=1: None
        return
    try:
        yield bar.update
    finally:
        bar.close()


def seconds_since(t0: float) -> float:
    """Return the seconds since ``t0`` (a :func:`time.perf_counter` reading), to 0.1 s."""
    return round(time.perf_counter() - t0, 1)


def ticker(say, what: str, every: float = 30.0):
    """Return a callback ``(done, total)`` saying ``what: done/total sequences`` now and then.

    It speaks every ``every`` seconds and at the end.

    Parameters
    ----------
    say : callable
        Takes one message.
    what : str
    every : float, optional
        Seconds between messages.

    Returns
    -------
    callable
    """
    last = [time.perf_counter()]

    def tick(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] >= every:
            last[0] = now
            say(f"{what}: {done}/{total} sequences")

    return tick
