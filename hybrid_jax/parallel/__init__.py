"""Scale-out: device meshes from the config, logical-axis sharding rules, multi-host start-up.

The engine is JAX's own: GSPMD through `jax.jit` with explicit shardings, `jax.distributed` for multi-host.
This package only turns the config into meshes, NamedShardings and checked start-up.
"""
