"""`python -m hybrid_jax hf export|import`: a run out to a transformers checkpoint, or one in as a run.

  hf export --workdir RUN --out DIR [--step N] [--arch auto|llama|mistral|smollm3|granite_swa|qwen3_5_text]
            [--dtype float32] [--max-shard-size 5GB] [--overwrite]
  hf import PATH --workdir RUN [--dtype float32] [--tensor-names TABLE.json]
    (--dtype: the imported run's compute dtype; --tensor-names: the checkpoint's tensor names, when they are not
    its model_type's, e.g. remote modeling code; format in hybrid_jax.hf.attention.weights.NameTable)

Each prints one JSON summary line; a checkpoint or run that cannot be mapped exactly exits 2 with the reason.
"""

import json
import pathlib

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.hf import HFError, io
from hybrid_jax.hf.attention import config as attention_config
from hybrid_jax.hf.families import export as family_export


def _refuse_files_in(folder, flag: str, advice: str):
  """Nothing is written over files this command did not just make: a folder that holds any is refused, naming one."""
  folder = pathlib.Path(folder)
  held = sorted(folder.iterdir()) if folder.is_dir() else []
  if held:
    more = f' and {len(held) - 1} more' if len(held) > 1 else ''
    raise HFError(f'{flag}={folder} is not empty (it holds {held[0].name}{more}): choose a new or empty directory; '
                  f'{advice}')


def _parser() -> parsing.ArgumentParser:
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax hf', description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest='action', required=True)
  export = sub.add_parser('export', help='write a run checkpoint as config.json + safetensors + tokenizer files')
  export.add_argument('--workdir', required=True, type=checks.IN_DIR,
                      help='run directory (config.json + checkpoints/)')
  export.add_argument('--out', required=True, type=checks.OUT_DIR,
                      help='output directory for the transformers checkpoint')
  export.add_argument('--step', type=checks.NONNEGATIVE_INT, default=None,
                      help='checkpoint step (default: the newest)')
  export.add_argument('--arch', default='auto',
                      choices=['auto', *attention_config.HF_CLASSES, *family_export.EXPORTERS],
                      help='transformers architecture (auto: Llama, Mistral or SmolLM3, the plainest that fits; '
                           'Qwen3.5 for a GDN hybrid)')
  export.add_argument('--dtype', default='float32', choices=list(io.EXPORT_DTYPES), help='tensor dtype on disk')
  export.add_argument('--max-shard-size', default=None,
                      help='largest safetensors file (e.g. 5GB, 500MB, 2GiB): shards listed in '
                           'model.safetensors.index.json; default: one model.safetensors')
  export.add_argument('--overwrite', action='store_true',
                      help='write into an --out that already holds files (the checkpoint files there are replaced)')
  imp = sub.add_parser('import', help='write a run directory from a transformers checkpoint directory')
  imp.add_argument('path', type=checks.IN_DIR, help='directory with config.json and safetensors')
  imp.add_argument('--workdir', required=True, type=checks.OUT_DIR,
                   help='new run directory to create')
  imp.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'],
                   help="the run's compute dtype (model.dtype); weights are kept in float32")
  imp.add_argument('--tensor-names', default=None, type=checks.IN_FILE,
                   help='JSON tensor-name table {"top": {...}, "layer": {...}, "sinks": ...} (default: the table '
                        "of the checkpoint's model_type)")
  return parser


def main(argv) -> int:
  """Export a run as a transformers checkpoint, or import one as a run."""
  args = _parser().parse_args(argv)
  if args.action == 'export':
    checks.path(args.out, '--out', exists=False, outside=f'{args.workdir}/checkpoints')  # Not into the run's own.
    if args.max_shard_size is not None:
      io.parse_size(args.max_shard_size)  # Refused before anything is read or written.
    if not args.overwrite:
      _refuse_files_in(args.out, '--out', 'or pass --overwrite to replace the checkpoint files in it')
    summary = io.export_run(args.workdir, args.out, step=args.step, arch=args.arch, dtype=args.dtype,
                            max_shard_size=args.max_shard_size)
  else:
    checks.path(args.workdir, '--workdir', exists=False, outside=args.path)  # Not inside the checkpoint read.
    _refuse_files_in(args.workdir, '--workdir', 'an import writes a new run')
    summary = io.import_hf(args.path, args.workdir, dtype=args.dtype, table=args.tensor_names)
  print(json.dumps(summary))
  return 0
