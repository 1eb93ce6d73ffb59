"""`python -m hybrid_jax build-tfds PATHS DATA_DIR`: build the dataset and print the config flags to use it."""

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.data.tfds_local import build_local_tfds


def main(argv) -> int:
  """Write text files as a local TFDS dataset (data.source=tfds)."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax build-tfds', description=__doc__)
  parser.add_argument('paths', help='comma-separated .txt / .jsonl(.gz) files, directories or globs')
  parser.add_argument('data_dir', type=checks.OUT_DIR,
                      help='TFDS data_dir to write into')
  parser.add_argument('--eval-fraction', type=checks.flag_number(positive=True, high=1), default=0.02,
                      help='share of documents held out for eval (below 1)')
  parser.add_argument('--text-field', default='text', help='JSONL field holding the text')
  args = parser.parse_args(argv)
  name = build_local_tfds(args.paths, args.data_dir, args.eval_fraction, args.text_field)
  print(f'--config.data.source=tfds --config.data.tfds_name={name} --config.data.tfds_data_dir={args.data_dir}')
  return 0
