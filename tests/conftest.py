"""Test-wide settings: hypothesis runs derandomized, so every run tests the same examples."""

from hypothesis import settings

settings.register_profile("variance_lab", derandomize=True, database=None, deadline=None)
settings.load_profile("variance_lab")
