"""tfplan's Hydra launcher plugin: every sweep point is a whole cluster (see tfplan.sweeps.sweep)."""
