"""`python -m hybrid_jax analyze <tool> --workdir RUN [options]`: the mechanistic analyses of a trained run.

Tools: retrieval-heads, tracing, tracing-overlay, restriction, probing, gradient-influence, routing. Each writes
JSON and a PNG into `<workdir>/analysis/` (or --out) and prints the JSON path and a one-line summary.
"""

import sys

from hybrid_jax import checks
from hybrid_jax.commands import parsing



def _parser() -> parsing.ArgumentParser:
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax analyze', description=__doc__)
  sub = parser.add_subparsers(dest='tool', metavar='TOOL', required=True)

  def tool(name, help_text, workdir=True):
    p = sub.add_parser(name, help=help_text, description=help_text)
    if workdir:
      p.add_argument('--workdir', required=True, type=checks.IN_DIR, help='run directory (config.json + checkpoints/)')
      p.add_argument('--step', type=checks.NONNEGATIVE_INT, default=None, help='checkpoint step (default: the newest)')
    p.add_argument('--out', default=None, type=checks.OUT_DIR,
                   help='output folder (default: <workdir>/analysis)')
    p.add_argument('--seed', type=checks.NONNEGATIVE_INT, default=42, help='seed of the prompts and documents')
    p.add_argument('--batch-size', type=checks.POSITIVE_INT, default=8, help='sequences per forward pass')
    p.add_argument('--no-progress', action='store_true', help='no progress lines on stderr')
    return p

  def needle_args(p, default_source):
    p.add_argument('--source', default=default_source,
                   help="needle prompts: study, study-essay, niah_single_1/2/3 (RULER) or recall (the run's own "
                   'recall task, data.source=recall)')
    p.add_argument('--samples', type=checks.POSITIVE_INT, default=20, help='needle prompts')
    p.add_argument('--length', type=checks.POSITIVE_INT, default=None,
                   help='prompt length in tokens (default: data.seq_len)')

  p = tool('retrieval-heads', 'Score every attention head as a retrieval head (two definitions); heat map.')
  needle_args(p, 'niah_single_1')
  p.add_argument('--top-k', type=checks.POSITIVE_INT, default=4, help='heads listed as the strongest')

  p = tool('tracing', 'Entropy and Q/K weight distance of retrieval heads over all saved checkpoints.')
  needle_args(p, 'study')
  p.add_argument('--heads', default='', help='LAYER:HEAD,... (default: top-k of the final checkpoint)')
  p.add_argument('--top-k', type=checks.POSITIVE_INT, default=4, help='heads traced when --heads is empty')
  p.add_argument('--reference-step', type=checks.NONNEGATIVE_INT, default=None,
                 help='weights compared against (default: final)')

  p = tool('tracing-overlay', 'Overlay the traces of several runs on one plot.', workdir=False)
  p.add_argument('--runs', nargs='+', required=True, type=checks.flag_path(),
                 help='run directories or tracing.json files')
  p.add_argument('--labels', nargs='*', default=None, help='legend labels, one per run (default: run names)')

  p = tool('restriction', 'Metrics with full-attention or efficient layers restricted to a window W (+ S sinks).')
  p.add_argument('--windows', type=checks.flag_numbers(integer=True, positive=True), required=True,
                 help='comma-separated windows W, e.g. 512,2048')
  p.add_argument('--sinks', type=checks.NONNEGATIVE_INT, default=0, help='leading sink tokens kept visible')
  p.add_argument('--targets', default='full,efficient', help='layers to restrict: full, efficient or both')
  p.add_argument('--chunk', type=checks.POSITIVE_INT, default=None,
                 help='recurrent layers: chunk C of the windowed state '
                 '(default W // 4; 1 = exact sliding window)')
  p.add_argument('--metrics', default='loss,niah', help='comma-separated: loss, niah, longppl')
  p.add_argument('--seq-len', type=checks.POSITIVE_INT, default=None,
                 help='context for loss and NIAH (default: data.seq_len)')
  p.add_argument('--batches', type=checks.POSITIVE_INT, default=2, help='held-out batches for the loss')
  p.add_argument('--buckets', type=checks.POSITIVE_INT, default=None,
                 help='loss-by-position buckets (default: eval.position_buckets)')
  needle_args(p, 'study')
  p.add_argument('--longppl-texts', default=None, type=checks.IN_FILE,
                 help='JSONL documents for LongPPL')
  p.add_argument('--longppl-spans', default=None, type=checks.IN_DIR,
                 help='folder of slice_<i>.txt key spans')

  p = tool('probing', 'Per-layer logistic-regression probes for the needle value.')
  p.add_argument('--samples', type=checks.POSITIVE_INT, default=400, help='needle prompts probed')
  p.add_argument('--length', type=checks.POSITIVE_INT, default=None,
                 help='prompt length in tokens (default: data.seq_len)')
  p.add_argument('--haystack', choices=('repeat', 'essay'), default='repeat', help='filler text around the needle')

  p = tool('gradient-influence', 'G(d): mean gradient norm of the output w.r.t. the input d tokens back.')
  p.add_argument('--context', type=checks.POSITIVE_INT, default=None,
                 help='tokens per document (default: data.seq_len)')
  p.add_argument('--samples', type=checks.POSITIVE_INT, default=16, help='documents averaged')
  p.add_argument('--last', type=checks.POSITIVE_INT, default=20, help='positions averaged in s')

  p = tool('routing', 'MoE models: the experts the needle and the answer-producing tokens use, against the rest.')
  needle_args(p, 'niah_single_1')
  p.add_argument('--draws', type=checks.POSITIVE_INT, default=200,
                 help='random control subsets that give the chance level of each distance')
  return parser


def _dispatch(args) -> dict:
  from hybrid_jax.analysis import gradient_influence, probing, restriction, retrieval_heads, routing, tracing
  from hybrid_jax.train.runs import load_run
  progress = not args.no_progress
  common = dict(out=args.out, batch_size=args.batch_size)
  if args.tool == 'tracing-overlay':
    return tracing.overlay(args.runs, labels=args.labels, out=args.out or '.')
  if args.tool == 'tracing':
    return tracing.run(args.workdir, heads=tracing.parse_heads(args.heads) or None,
                       reference_step=args.reference_step, source=args.source, num_samples=args.samples,
                       length=args.length, seed=args.seed, top_k=args.top_k, progress=progress, **common)
  run = load_run(args.workdir, args.step)
  if args.tool == 'retrieval-heads':
    return retrieval_heads.run(run, source=args.source, num_samples=args.samples, length=args.length,
                               seed=args.seed, top_k=args.top_k, progress=progress, **common)
  if args.tool == 'restriction':
    targets = [t.strip() for t in args.targets.split(',') if t.strip()]
    restrictions = [restriction.Restriction(t, w, args.sinks, args.chunk) for t in targets for w in args.windows]
    return restriction.run(run, restrictions, metrics=[m.strip() for m in args.metrics.split(',') if m.strip()],
                           seq_len=args.seq_len, batches=args.batches, buckets=args.buckets,
                           niah_source=args.source, niah_samples=args.samples, niah_length=args.length,
                           seed=args.seed, longppl_texts=args.longppl_texts, longppl_spans=args.longppl_spans,
                           progress=progress, **common)
  if args.tool == 'routing':
    return routing.run(run, source=args.source, num_samples=args.samples, length=args.length, seed=args.seed,
                       draws=args.draws, out=args.out)
  if args.tool == 'probing':
    return probing.run(run, num_samples=args.samples, length=args.length, haystack=args.haystack, seed=args.seed,
                       progress=progress, **common)
  return gradient_influence.run(run, context=args.context, num_samples=args.samples, last=args.last,
                                progress=progress, **common)


def _summary(tool, result) -> str:
  if tool == 'retrieval-heads':
    top = result['top_heads']['mass'][:1]
    return f"top head (mass): {top[0] if top else 'none (no attention layers)'}"
  if tool == 'restriction':
    return f"{len(result['rows'])} rows; table in {result['json'].replace('.json', '.md')}"
  if tool == 'probing':
    return f"best residual probe accuracy {max(result['residual']):.3f} (chance {result['chance']:.3f})"
  if tool == 'gradient-influence':
    return f"G(1) = {result['G'][0]:.4g}, G({result['context']}) = {result['G'][-1]:.4g}"
  if tool == 'routing':
    worst = max(result['layers'], key=lambda r: r['needle']['tv'] - r['needle']['null_p95'])
    return (f"{len(result['layers'])} MoE layers; needle routing furthest from the control at layer "
            f"{worst['index']}: TV {worst['needle']['tv']:.3f} (chance up to {worst['needle']['null_p95']:.3f})")
  if tool == 'tracing':
    return f"{len(result['steps'])} checkpoints, {len(result['heads'])} heads"
  return f"{len(result['runs'])} runs"


def main(argv=None) -> int:
  """Dissect a trained run: probing, restriction, tracing, retrieval heads, influence, routing."""
  args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
  if getattr(args, 'workdir', None) and not args.out:  # Refused before minutes of analysis, not after.
    checks.path(f'{args.workdir}/analysis', '--out (default: WORKDIR/analysis)', kind='dir', exists=False,
                writable=True)
  result = _dispatch(args)
  print(f"{args.tool}: {_summary(args.tool, result)}")
  print(f"json: {result['json']}\nplot: {result['plot']}")
  return 0
