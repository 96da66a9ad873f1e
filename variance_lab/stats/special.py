"""Special functions shared by the theory, the families and the rollout models (one home each)."""
