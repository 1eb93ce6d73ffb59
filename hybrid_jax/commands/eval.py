"""`python -m hybrid_jax eval --workdir RUN --tasks ppl,niah,... [--context-lengths 4096,16384]`.

Loads the run's newest (or `--step`) checkpoint, runs each task at each context length, writes
`RUN/eval/<task>.json` plus plots, and prints a one-screen summary table.
"""

from absl import logging

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.train import runs as runs_lib
from hybrid_jax.eval import suite




def build_parser() -> parsing.ArgumentParser:
  p = parsing.ArgumentParser(prog='python -m hybrid_jax eval', description=__doc__)
  p.add_argument('--workdir', required=True, type=checks.IN_DIR,
                 help='run directory (config.json + checkpoints/)')
  p.add_argument('--step', type=checks.NONNEGATIVE_INT, default=None, help='checkpoint step (default: the newest)')
  p.add_argument('--tasks', default='ppl,niah',
                 help=f'comma-separated tasks among {", ".join(suite.TASKS)}; name:sub+sub picks sub-tasks')
  p.add_argument('--context-lengths', type=checks.flag_numbers(integer=True, positive=True), default=None,
                 help="context lengths in tokens (default: the run's training seq_len)")
  p.add_argument('--max-context', type=checks.POSITIVE_INT, default=None,
                 help="longest context allowed (default: 8 x the run's training seq_len); guards against typos")
  p.add_argument('--samples', type=checks.POSITIVE_INT, default=4,
                 help='samples per task (per NIAH cell) and context length')
  p.add_argument('--depths', type=checks.flag_numbers(low=0, high=1), default=[0.0, 0.25, 0.5, 0.75, 1.0],
                 help='NIAH needle depths')
  p.add_argument('--seed', type=checks.NONNEGATIVE_INT, default=42, help='seed of the synthetic tasks')
  p.add_argument('--batch-size', type=checks.POSITIVE_INT, default=4, help='sequences per forward / generation batch')
  p.add_argument('--ppl-batches', type=checks.POSITIVE_INT, default=4,
                 help='packed held-out batches for ppl\'s packed_loss')
  p.add_argument('--ppl-documents', type=checks.flag_number(integer=True, low=2), default=None,
                 help="held-out documents (each >= the longest context) for ppl's loss by position "
                      "(default: the run's eval.documents)")
  p.add_argument('--squad', default=None, type=checks.IN_FILE, help='SQuAD-format JSON for RULER qa_1')
  p.add_argument('--hotpotqa', default=None, type=checks.IN_FILE,
                 help='HotpotQA-format JSON for RULER qa_2')
  p.add_argument('--longbench-dir', default=None, type=checks.IN_DIR,
                 help='directory of LongBench v1 <task>.jsonl files')
  p.add_argument('--longppl-data', default=None, type=checks.IN_FILE,
                 help='JSONL of {"text", optional "spans"} documents')
  p.add_argument('--longppl-evaluator', default=None, help='run dir (or "self") choosing key tokens where spans '
                 'are missing')
  p.add_argument('--longppl-trunc-len', type=checks.POSITIVE_INT, default=4096,
                 help='LongPPL: tokens kept per document')
  p.add_argument('--longppl-stride', type=checks.POSITIVE_INT, default=1024,
                 help='LongPPL: sliding-window stride in tokens')
  p.add_argument('--longppl-alpha', type=checks.flag_number(), default=2.0,
                 help='LongPPL: key-token threshold on the log-probability gain')
  p.add_argument('--longppl-beta', type=checks.flag_number(), default=-2.0,
                 help='LongPPL: key-token threshold on the short-context log-probability')
  p.add_argument('--lm-eval-include', default=None, type=checks.IN_DIR,
                 help='directory of extra lm-eval task YAMLs (local tasks)')
  p.add_argument('--out', default=None, type=checks.OUT_DIR,
                 help='output directory (default: WORKDIR/eval)')
  p.add_argument('--no-progress', action='store_true', help='no progress bars')
  return p


def main(argv) -> int:
  """Evaluate a run: perplexity, long-context perplexity, NIAH, RULER, LongBench."""
  args = build_parser().parse_args(argv)
  logging.set_verbosity(logging.ERROR)  # Orbax's read-only notes would bury the summary.
  requests = suite.parse_tasks(args.tasks)
  config = runs_lib.load_config(args.workdir)
  out = args.out or f'{args.workdir}/eval'
  checks.path(out, '--out' if args.out else '--out (default: WORKDIR/eval)', kind='dir', exists=False,
              writable=True)  # Before minutes of evaluation, not after.
  trained = int(config.data.seq_len)
  lengths = args.context_lengths or [trained]
  limit = args.max_context or 8 * trained
  too_long = [n for n in lengths if n > limit]
  if too_long:
    raise suite.EvalError(f'context length(s) {too_long} exceed --max-context={limit} (the run trained at '
                          f'{trained} tokens); raise --max-context to evaluate that far')
  if args.longppl_stride >= args.longppl_trunc_len:
    raise suite.EvalError(f'--longppl-stride={args.longppl_stride} must be below --longppl-trunc-len='
                          f'{args.longppl_trunc_len}')
  settings = suite.Settings(
      context_lengths=lengths, samples=args.samples, depths=tuple(args.depths), seed=args.seed,
      batch_size=args.batch_size, ppl_batches=args.ppl_batches, ppl_documents=args.ppl_documents,
      squad=args.squad, hotpotqa=args.hotpotqa,
      longbench_dir=args.longbench_dir, longppl_data=args.longppl_data, longppl_evaluator=args.longppl_evaluator,
      longppl_trunc_len=args.longppl_trunc_len, longppl_stride=args.longppl_stride,
      longppl_alpha=args.longppl_alpha, longppl_beta=args.longppl_beta,
      lm_eval_include=args.lm_eval_include, progress=not args.no_progress)
  run = runs_lib.load_run(args.workdir, args.step, config=config)
  results, rows = suite.run_tasks(run, requests, settings, out_dir=args.out)
  print(f'{run.config.name} at step {run.step}: {", ".join(results)} -> {out}/')
  print(suite.summary_table(rows))
  return 0
