"""Analyses of trained models and of sweeps (scaling laws; mechanistic probes arrive later)."""
