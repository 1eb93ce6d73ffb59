"""lm-evaluation-harness on our checkpoints: the three request types answered by a ModelScorer.

`Requests` holds the harness-independent logic (and is tested without the harness); `make_lm` wraps it in an
`lm_eval.api.model.LM` subclass when the optional `lm_eval` package is installed (`pip install
'hybrid_jax[eval]'`; from 0.4.13 the harness runs without torch or transformers).

Conventions follow the harness's own models: an empty context is conditioned on EOS; inputs longer than
`max_length` lose tokens on the left; rolling log-likelihoods use disjoint windows (each token scored once,
with up to `max_length - 1` tokens of context restarting at each window).
"""

from typing import Sequence

import numpy as np

from hybrid_jax.eval.scoring import ModelScorer


class UnknownTasks(ValueError):
  """A task name lm-evaluation-harness does not know."""


class NotInstalled(ImportError):
  """The optional lm_eval package is missing."""


class Requests:
  """Answers loglikelihood, loglikelihood_rolling and generate_until requests with one model."""

  def __init__(self, scorer: ModelScorer, *, max_length: int, batch_size: int = 4):
    if max_length < 2:
      raise ValueError(f'max_length={max_length} must be at least 2')
    self.scorer, self.max_length, self.batch_size = scorer, max_length, batch_size
    self.tok = scorer.tokenizer

  def _encode(self, text: str) -> list[int]:
    return self.tok.encode(text).tolist()

  def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
    """(log p(continuation | context), whether greedy decoding would produce exactly the continuation)."""
    out = []
    for context, continuation in pairs:
      context_ids = self._encode(context) or [self.tok.eos_id]
      target = self._encode(continuation)
      if not target:
        raise ValueError(f'empty continuation for context {context[-40:]!r}')
      ids = (context_ids + target)[-self.max_length - 1:]  # +1: the last token is only a target
      nll, greedy = self.scorer.nll_and_greedy(ids)
      scored = min(len(target), len(ids) - 1)
      out.append((-float(nll[-scored:].sum()), bool(greedy[-scored:].all())))
    return out

  def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
    """log p(text) token by token (the first token conditioned on EOS), in disjoint windows."""
    out = []
    for text in texts:
      ids = [self.tok.eos_id] + self._encode(text)
      total, start = 0.0, 1
      while start < len(ids):
        end = min(start + self.max_length, len(ids))
        window = ids[max(0, end - self.max_length - 1):end]
        total -= float(self.scorer.nll(window)[-(end - start):].sum())
        start = end
      out.append(total)
    return out

  def generate_until(self, requests: Sequence[tuple[str, dict]]) -> list[str]:
    """Greedy text after each context, cut at the first of `until`, at most `max_gen_toks` tokens."""
    out = []
    for context, kwargs in requests:
      kwargs = dict(kwargs or {})
      until = kwargs.pop('until', None) or []
      until = [until] if isinstance(until, str) else list(until)
      limit = int(kwargs.pop('max_gen_toks', 256))
      if kwargs.pop('do_sample', False) or kwargs.pop('temperature', 0.0):
        raise ValueError('only greedy generation is supported (do_sample=False, temperature=0)')
      ids = self._encode(context)[-max(1, self.max_length - limit):] or [self.tok.eos_id]
      out += self.scorer.generate([self.tok.decode(ids)], limit, stop_strings=until, batch_size=1)
    return out


def _import_lm_eval():
  try:
    import lm_eval  # pylint: disable=g-import-not-at-top
    from lm_eval.api.model import LM  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise NotInstalled("lm_eval tasks need lm-evaluation-harness: pip install 'hybrid_jax[eval]' "
                       f'(import failed: {e})') from e
  return lm_eval, LM


def make_lm(scorer: ModelScorer, *, max_length: int, batch_size: int = 4):
  """An `lm_eval.api.model.LM` instance answering the harness's requests with `scorer`'s model."""
  _, lm_base = _import_lm_eval()
  requests = Requests(scorer, max_length=max_length, batch_size=batch_size)

  class HybridJaxLM(lm_base):
    """lm-evaluation-harness model backed by a hybrid_jax checkpoint."""

    def loglikelihood(self, instances, disable_tqdm: bool = False):
      return requests.loglikelihood([inst.args for inst in instances])

    def loglikelihood_rolling(self, instances, disable_tqdm: bool = False):
      return requests.loglikelihood_rolling([inst.args[0] for inst in instances])

    def generate_until(self, instances, disable_tqdm: bool = False):
      return requests.generate_until([inst.args for inst in instances])

  return HybridJaxLM()


def evaluate(scorer: ModelScorer, tasks: Sequence[str], *, max_length: int, batch_size: int = 4, seed: int = 42,
             limit: int | None = None, include_path: str | None = None) -> dict:
  """{task: {metric: value}} from `lm_eval.simple_evaluate` on our model (`include_path`: local task YAMLs)."""
  lm_eval, _ = _import_lm_eval()
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  task_manager = TaskManager(include_path=include_path) if include_path else TaskManager()
  unknown = [task for task in tasks if task not in task_manager.all_tasks]
  if unknown:  # Named before any request runs (lm_eval raises a KeyError deep inside otherwise).
    raise UnknownTasks(f'lm_eval task(s) {", ".join(map(repr, unknown))} unknown to lm-evaluation-harness '
                       f'{lm_eval.__version__ if hasattr(lm_eval, "__version__") else ""} (its task names: '
                       '`lm_eval --tasks list`; local YAMLs: --lm-eval-include DIR)')
  results = lm_eval.simple_evaluate(model=make_lm(scorer, max_length=max_length, batch_size=batch_size),
                                    tasks=list(tasks), limit=limit, random_seed=seed, numpy_random_seed=seed,
                                    task_manager=task_manager)
  return {task: {k: (float(v) if isinstance(v, (int, float, np.floating)) else v) for k, v in metrics.items()}
          for task, metrics in results['results'].items()}
