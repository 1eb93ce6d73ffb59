"""The evaluation tasks a run can be put through, each writing `<workdir>/eval/<task>.json` (and plots).

A task is named on the command line as `name` or `name:sub+sub` (e.g. `ruler:niah_single_1+vt`,
`longbench:qasper+trec`, `lm_eval:arc_easy`). Every task runs at each requested context length; a task function
returns its JSON-ready result plus the rows of the summary table.
"""

import dataclasses
import json
import math
import pathlib
from typing import Callable, Sequence

import numpy as np
import tqdm

from hybrid_jax import readers
from hybrid_jax.train import runs as runs_lib
from hybrid_jax.data import pipeline, sources
from hybrid_jax.errors import UserError
from hybrid_jax.eval import longbench, longppl, niah, perplexity, position, ruler
from hybrid_jax.eval.scoring import ModelScorer
from hybrid_jax.train import step as step_lib


class EvalError(UserError, ValueError):
  """A task request cannot run: unknown task, missing data file, or an unusable context length."""


@dataclasses.dataclass
class Settings:
  """Options shared by the tasks (command-line flags of `python -m hybrid_jax eval`)."""
  context_lengths: Sequence[int]
  samples: int = 4  # Per RULER task / LongBench task / NIAH cell, per context length.
  depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)
  seed: int = 42
  batch_size: int = 4
  ppl_batches: int = 4  # Packed held-out batches per context length.
  ppl_documents: int | None = None  # Held-out documents for loss by position; None = the run's eval.documents.
  squad: str | None = None
  hotpotqa: str | None = None
  longbench_dir: str | None = None
  longppl_data: str | None = None
  longppl_evaluator: str | None = None
  longppl_trunc_len: int = 4096
  longppl_stride: int = 1024
  longppl_alpha: float = 2.0
  longppl_beta: float = -2.0
  lm_eval_include: str | None = None  # Directory of extra lm-eval task YAMLs (local tasks).
  progress: bool = True


@dataclasses.dataclass
class Context:
  run: runs_lib.Run
  scorer: ModelScorer
  settings: Settings
  out_dir: pathlib.Path

  def bar(self, iterable, desc, total=None):
    return tqdm.tqdm(iterable, desc=desc, total=total, disable=not self.settings.progress, leave=False,
                     dynamic_ncols=True)


Row = tuple[str, str, str, float]  # (task, context, metric, value) of the summary table.


# ------------------------------------------------------------------------------------------------------- ppl

def run_ppl(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """Loss by position inside held-out documents (the same documents at every context length), and the held-out
  loss over packed rows (what training optimises) beside it, labelled packed."""
  _no_subtasks('ppl', subtasks)
  s = ctx.settings
  config = ctx.run.config.copy_and_resolve_references()
  eval_step = step_lib.make_eval_step(ctx.run.model_def, loss_chunk=config.train.loss_chunk)
  config.train.batch_size = s.batch_size
  count = s.ppl_documents or int(config.eval.documents)
  if not count:
    raise EvalError('ppl measures loss by position on held-out documents: the run has eval.documents=0, so pass '
                    '--ppl-documents N (N >= 2)')
  try:
    documents = pipeline.held_out_documents(config, max(s.context_lengths), count)
  except sources.DataError as e:
    raise EvalError(f'ppl: {e}') from e
  by_document = position.evaluate(eval_step, ctx.run.params, documents, s.context_lengths,
                                  batch_size=s.batch_size, packing=config.data.packing).summary(int(config.eval.position_buckets))
  result, rows = {}, []
  for length in s.context_lengths:
    config.data.seq_len = int(length)
    packed = perplexity.evaluate_packed(eval_step, ctx.run.params, pipeline.make_eval_batches(config, s.ppl_batches))
    result[str(length)] = r = {**by_document[str(length)], **packed}
    rows += [('ppl', str(length), 'loss', r['loss']), ('ppl', str(length), 'perplexity', r['perplexity']),
             ('ppl', str(length), 'packed_loss', r['packed_loss'])]
  _plot_loss_by_position(by_document, ctx.out_dir / 'ppl_by_position.png', title=ctx.run.config.name)
  return {'documents': {'source': documents.source, 'count': len(documents.ids), 'min_tokens': documents.min_tokens,
                        'ids': documents.ids},
          'by_context': result}, rows


def _plot_loss_by_position(by_document: dict, path, *, title: str):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(6.5, 4.2))
  ax = fig.subplots()
  position.plot(ax, {f'context {n}': r for n, r in by_document.items()})
  longest = max(by_document, key=int)
  ax.set_title(f"{title}: loss by position in {by_document[longest]['documents']} held-out documents "
               f'of >= {longest} tokens', fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


# --------------------------------------------------------------------------------------------------- longppl

def _read_longppl_documents(path) -> list[dict]:
  if not path:
    raise EvalError('longppl needs documents: --longppl-data FILE.jsonl (one {"text": ..., optional "spans": '
                    '[[start, end], ...]} per line)')
  if not pathlib.Path(path).is_file():
    raise EvalError(f'--longppl-data={path}: no such file')
  docs = readers.read_jsonl(path, '--longppl-data', {'text': str})
  for record in docs:
    if 'spans' in record:
      record['spans'] = [tuple(s) for s in record['spans']]
      longppl.check_spans(longppl.merge_spans(record['spans']), record['text'])
  if not docs:
    raise EvalError(f'{path} holds no documents')
  return docs


def run_longppl(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """LongPPL and PPL over documents with key spans (from the file, or chosen by an evaluator run)."""
  _no_subtasks('longppl', subtasks)
  s = ctx.settings
  docs = _read_longppl_documents(s.longppl_data)
  missing = [i for i, d in enumerate(docs) if 'spans' not in d]
  evaluator_name = None
  if missing:
    if not s.longppl_evaluator:
      raise EvalError(f'{len(missing)} document(s) of {s.longppl_data} have no "spans": give them spans or name an '
                      'evaluator run (--longppl-evaluator RUN_DIR, or "self" for this run)')
    evaluator = ctx.scorer if s.longppl_evaluator == 'self' else ModelScorer.from_run(
        runs_lib.load_run(s.longppl_evaluator))
    evaluator_name = s.longppl_evaluator
    longest = max(s.context_lengths)
    for i in ctx.bar(missing, 'longppl key tokens'):
      ids, offsets = evaluator.tokenizer.encode_with_offsets(docs[i]['text'])
      ids, offsets = ids[:longest], offsets[:longest]
      full = evaluator.nll(ids)
      short = longppl.truncated_nll(ids, evaluator.nll, s.longppl_trunc_len, s.longppl_stride)
      docs[i]['spans'] = longppl.key_spans(offsets, full, short, s.longppl_alpha, s.longppl_beta)
  tokenizer = ctx.scorer.tokenizer
  encoded = [tokenizer.encode_with_offsets(d['text']) for d in docs]
  result, rows = {}, []
  for length in s.context_lengths:
    per_doc = [longppl.longppl(ctx.scorer.nll(ids[:length]), offsets[:length], d['spans'])
               for (ids, offsets), d in ctx.bar(list(zip(encoded, docs)), f'longppl {length}')]
    result[str(length)] = {**longppl.aggregate(per_doc), 'documents': per_doc}
    rows += [('longppl', str(length), 'longppl', result[str(length)]['longppl']),
             ('longppl', str(length), 'ppl', result[str(length)]['ppl'])]
  return {'evaluator': evaluator_name, 'alpha': s.longppl_alpha, 'beta': s.longppl_beta,
          'trunc_len': s.longppl_trunc_len, 'stride': s.longppl_stride, 'by_context': result}, rows


# ------------------------------------------------------------------------------------------------------ niah

def _generate_samples(ctx: Context, samples: Sequence[dict], desc: str, *, stop_strings=()) -> list[str]:
  prompts = [s['input'] + s['answer_prefix'] for s in samples]
  limits = [int(s['max_new_tokens']) for s in samples]
  out = []
  for start in ctx.bar(range(0, len(prompts), ctx.settings.batch_size), desc,
                       total=math.ceil(len(prompts) / ctx.settings.batch_size)):
    end = start + ctx.settings.batch_size
    out += ctx.scorer.generate(prompts[start:end], limits[start:end], stop_strings=stop_strings,
                               batch_size=ctx.settings.batch_size)
  return out


def run_niah(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """Single-needle NIAH over a depth x context-length grid, with its heat map."""
  task = subtasks[0] if subtasks else 'niah_single_2'
  if len(subtasks) > 1:
    raise EvalError(f'niah takes one single-needle task (niah:niah_single_1), not {"+".join(subtasks)}')
  s = ctx.settings
  lengths = list(s.context_lengths)
  try:
    grid = niah.build_grid(lengths, s.depths, samples_per_cell=s.samples, task=task, seed=s.seed,
                           count_tokens=ctx.scorer.count_tokens)
  except (ValueError, ruler.ContextTooShort) as e:
    raise EvalError(f'niah: {e}') from e
  predictions = _generate_samples(ctx, grid, 'niah')
  scores = niah.score_grid(grid, predictions, s.depths, lengths)
  niah.plot_heatmap(scores, s.depths, lengths, str(ctx.out_dir / 'niah_heatmap.png'),
                    title=f'{ctx.run.config.name}: {task}')
  by_length = {str(n): float(np.nanmean(scores[:, j])) for j, n in enumerate(lengths)}
  samples = [{'depth': g['depth'], 'context': g['max_seq_length'], 'outputs': g['outputs'], 'prediction': p}
             for g, p in zip(grid, predictions)]
  return ({'task': task, 'depths': list(s.depths), 'context_lengths': lengths, 'scores': scores.tolist(),
           'by_context': by_length, 'average': float(np.nanmean(scores)), 'samples': samples,
           'word_source': ruler.word_source()},
          [('niah', n, 'score', v) for n, v in by_length.items()])


# ----------------------------------------------------------------------------------------------------- ruler

def run_ruler(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """The RULER-style suite (all 13 tasks, or the named ones) at every context length."""
  s = ctx.settings
  tasks = list(subtasks) or list(ruler.TASKS)
  for t in tasks:
    if t not in ruler.TASKS:
      raise EvalError(f'unknown RULER task {t!r}: choose from {", ".join(ruler.TASKS)}')
  needs = {'qa_1': ('squad', s.squad), 'qa_2': ('hotpotqa', s.hotpotqa)}
  for t in tasks:
    if t in needs and not needs[t][1]:
      raise EvalError(f'RULER task {t} reads a local {needs[t][0]} JSON file: pass --{needs[t][0]}=PATH, or pick '
                      f'tasks without it (e.g. ruler:{"+".join(x for x in tasks if x not in needs) or "vt"})')
    if t in needs and not pathlib.Path(needs[t][1]).is_file():
      raise EvalError(f'--{needs[t][0]}={needs[t][1]}: no such file')
  try:
    suite = ruler.generate_suite(tasks, list(s.context_lengths), s.samples, seed=s.seed,
                                 count_tokens=ctx.scorer.count_tokens, squad_path=s.squad, hotpotqa_path=s.hotpotqa)
  except ruler.ContextTooShort as e:
    raise EvalError(f'ruler: {e}') from e
  result, rows = {}, []
  for length, by_task in suite.items():
    predictions = {t: _generate_samples(ctx, samples, f'ruler {t} {length}') for t, samples in by_task.items()}
    scored = ruler.score_suite(by_task, predictions)
    scored['predictions'] = predictions
    result[str(length)] = scored
    rows += [('ruler', str(length), 'average', scored['average']),
             ('ruler', str(length), 'niah_average', scored['niah_average'])]
  summary = ruler.summarize_lengths({int(n): r['average'] for n, r in result.items()})
  return {'tasks': tasks, 'by_context': result, 'across_lengths': summary, 'word_source': ruler.word_source()}, rows


# ------------------------------------------------------------------------------------------------- longbench

def run_longbench(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """LongBench v1 tasks from local JSONL files (`<dir>/<task>.jsonl`), first `samples` of each."""
  s = ctx.settings
  if not s.longbench_dir:
    raise EvalError('longbench reads the official JSONL files: --longbench-dir=DIR holding <task>.jsonl')
  tasks = list(subtasks) or list(longbench.TASKS)
  for t in tasks:
    if t not in longbench.TASKS:
      raise EvalError(f'unknown LongBench task {t!r}: choose from {", ".join(longbench.TASKS)}')
  files = {t: pathlib.Path(s.longbench_dir) / f'{t}.jsonl' for t in tasks}
  missing = [str(p) for p in files.values() if not p.is_file()]
  if missing:
    raise EvalError(f'missing LongBench file(s): {", ".join(missing)} (pick tasks with longbench:task+task)')
  tok = ctx.scorer.tokenizer
  data = {t: longbench.read_jsonl(str(p))[:s.samples] for t, p in files.items()}
  result, rows = {}, []
  for length in s.context_lengths:
    per_task = {}
    for task, samples in data.items():
      budget = int(length) - longbench.max_new_tokens(task)
      if budget <= 0:
        raise EvalError(f'context {length} leaves no room for a {task} prompt ({longbench.max_new_tokens(task)} '
                        'tokens are generated)')
      prepared = [longbench.prepare(task, x, max_length=budget, encode=tok.encode, decode=tok.decode) for x in samples]
      batch = [{'input': p['prompt'], 'answer_prefix': '', 'max_new_tokens': p['max_new_tokens']} for p in prepared]
      predictions = _generate_samples(ctx, batch, f'longbench {task} {length}',
                                      stop_strings=('\n',) if task == 'samsum' else ())
      score = longbench.score_task(task, predictions, [p['answers'] for p in prepared],
                                   prepared[0]['all_classes'])
      per_task[task] = {'score': score, 'num_samples': len(prepared), 'predictions': predictions}
    averages = longbench.averages({t: r['score'] for t, r in per_task.items()})
    result[str(length)] = {'per_task': per_task, **averages}
    rows.append(('longbench', str(length), 'plain_mean', averages['plain_mean']))
  return {'tasks': tasks, 'by_context': result}, rows


# ---------------------------------------------------------------------------------------------------- lm_eval

def run_lm_eval(ctx: Context, subtasks) -> tuple[dict, list[Row]]:
  """Any lm-evaluation-harness task, through our adapter (needs the optional `lm_eval` package)."""
  if not subtasks:
    raise EvalError('lm_eval needs task names: lm_eval:task+task (any task lm-evaluation-harness knows)')
  from hybrid_jax.eval import lm_eval_adapter  # pylint: disable=g-import-not-at-top
  try:
    results = lm_eval_adapter.evaluate(ctx.scorer, list(subtasks), max_length=max(ctx.settings.context_lengths),
                                       batch_size=ctx.settings.batch_size, seed=ctx.settings.seed,
                                       limit=ctx.settings.samples, include_path=ctx.settings.lm_eval_include)
  except (lm_eval_adapter.NotInstalled, lm_eval_adapter.UnknownTasks) as e:
    raise EvalError(str(e)) from e
  rows = [('lm_eval', '-', f'{task}/{metric}', value) for task, metrics in results.items()
          for metric, value in metrics.items() if isinstance(value, (int, float))]
  return {'tasks': list(subtasks), 'results': results}, rows


# ------------------------------------------------------------------------------------------------- registry

TASKS: dict[str, Callable[[Context, Sequence[str]], tuple[dict, list[Row]]]] = {
    'ppl': run_ppl, 'longppl': run_longppl, 'niah': run_niah, 'ruler': run_ruler, 'longbench': run_longbench,
    'lm_eval': run_lm_eval}


def _no_subtasks(task, subtasks):
  if subtasks:
    raise EvalError(f'{task} takes no sub-tasks, got {task}:{"+".join(subtasks)}')


def parse_tasks(spec: str) -> list[tuple[str, list[str]]]:
  """'ppl,ruler:vt+cwe' -> [('ppl', []), ('ruler', ['vt', 'cwe'])]; unknown names raise EvalError."""
  requests = []
  for item in (x.strip() for x in spec.split(',')):
    if not item:
      continue
    name, _, subs = item.partition(':')
    if name not in TASKS:
      raise EvalError(f'unknown eval task {name!r}: choose from {", ".join(TASKS)}')
    requests.append((name, [x for x in subs.split('+') if x]))
  if not requests:
    raise EvalError(f'no tasks in {spec!r}: choose from {", ".join(TASKS)}')
  return requests


def run_tasks(run: runs_lib.Run, requests, settings: Settings, *, out_dir=None) -> tuple[dict, list[Row]]:
  """Runs each request, writing `<out_dir>/<task>.json` (default out_dir: `<workdir>/eval`) as each finishes."""
  out_dir = pathlib.Path(out_dir or run.workdir / 'eval')
  out_dir.mkdir(parents=True, exist_ok=True)
  ctx = Context(run, ModelScorer.from_run(run), settings, out_dir)
  results, rows = {}, []
  for name, subtasks in requests:
    result, task_rows = TASKS[name](ctx, subtasks)
    result = {'task': name, 'subtasks': list(subtasks), 'run': str(run.workdir), 'step': run.step,
              'context_lengths': list(settings.context_lengths), **result}
    (out_dir / f'{name}.json').write_text(json.dumps(result, indent=2, default=_json_default) + '\n')
    results[name] = result
    rows += task_rows
  return results, rows


def _json_default(o):
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  raise TypeError(f'{type(o).__name__} is not JSON serializable')


def summary_table(rows: Sequence[Row]) -> str:
  """The one-screen summary: task, context, metric, value."""
  header = ('task', 'context', 'metric', 'value')
  cells = [header] + [(t, c, m, f'{v:.4g}' if isinstance(v, float) else str(v)) for t, c, m, v in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(4)]
  return '\n'.join('  '.join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in cells)
