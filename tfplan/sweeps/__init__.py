"""Sweeps: Hydra's multirun where every point is a whole cluster, and their reports."""
