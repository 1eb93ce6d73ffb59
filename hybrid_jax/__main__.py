"""`python -m hybrid_jax <command> [flags]`."""

from hybrid_jax.cli import main

if __name__ == '__main__':
  main()
