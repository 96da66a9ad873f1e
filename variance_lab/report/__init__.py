"""Tables and figures, built from tidy frames only (never from the engine)."""
