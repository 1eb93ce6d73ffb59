"""`python -m hybrid_jax pretokenize`: tokenize a corpus once into ArrayRecord shards (data.source=pretokenized)."""

import shlex

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.config import load_run
from hybrid_jax.data import pretokenize as pretokenize_lib
from hybrid_jax.data.pretokenize import DEFAULT_SHARD_TOKENS, pretokenize


def main(argv) -> int:
  """Tokenize a corpus once into ArrayRecord shards (data.source=pretokenized)."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax pretokenize',
                                  description=pretokenize_lib.__doc__.split('\n\n')[0],
                                  epilog='--config.KEY=VALUE overrides (e.g. --config.data.paths=...) follow '
                                  '--config as for train.')
  parser.add_argument('--config', required=True, help='config file[:arg], as for train')
  parser.add_argument('--out', required=True, type=checks.OUT_DIR,
                      help='directory to write (shards + manifest.json); written under a temporary name and renamed '
                      'when complete')
  parser.add_argument('--shard-tokens', type=checks.POSITIVE_INT,
                      default=DEFAULT_SHARD_TOKENS, help='tokens per shard, at most')
  parser.add_argument('--workers', type=checks.NONNEGATIVE_INT, default=0,
                      help='grain worker processes that tokenize')
  parser.add_argument('--no-progress', action='store_true', help='no progress bar')
  args, overrides = parser.parse_known_args(argv)
  if overrides and not overrides[0].startswith('--config.'):
    parser.error(f'unrecognized arguments: {" ".join(overrides)}')
  _, _, config = load_run(shlex.join([args.config, *overrides]))
  manifest = pretokenize(config, args.out, args.shard_tokens, args.workers, progress=not args.no_progress)
  for split, entry in manifest['splits'].items():
    print(f"{split}: {entry['documents']} documents, {entry['tokens']} tokens, {len(entry['shards'])} shards")
  print(f'train on it with --config.data.source=pretokenized --config.data.paths={args.out} '
        f"--config.data.tokenizer={manifest['tokenizer']['spec']}")
  return 0
