"""Test-wide settings and fixtures: hypothesis runs derandomized, so every run tests the same examples."""

import signal

import pytest
from hypothesis import settings

settings.register_profile("variance_lab", derandomize=True, database=None, deadline=None)
settings.load_profile("variance_lab")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sigint_default():
    """Return a ``preexec_fn`` for a child that a test interrupts: Ctrl-C as at a terminal.

    A test run started in the background by a shell without job control (``make test &``,
    ``nohup``) ignores SIGINT; children inherit that, Python then installs no
    KeyboardInterrupt handler, and a child sent SIGINT runs on to its end.
    """
    return _default_sigint
