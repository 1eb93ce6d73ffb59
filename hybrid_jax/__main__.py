"""`python -m hybrid_jax <command> [flags]`."""

from hybrid_jax.commands import main

if __name__ == '__main__':
  main()
