"""LongBench v1 adapter: official-format JSONL, prompts, middle truncation, and the official scorer's metrics.

Prompt templates and generation lengths are LongBench's own (THUDM/LongBench@2e00731, copied into
`hybrid_jax/eval/data/`). The metrics reproduce `LongBench/metrics.py` exactly, quirks included (see each
function), because published LongBench numbers depend on them. Scorer packages: `rouge` (1.0.1, pltrdy),
`jieba` and `rapidfuzz`; each is imported only by the metric that needs it.
"""

import collections
import functools
import json
import os
import pathlib
import re
import string
import sys
import threading
from typing import Callable, Sequence

from hybrid_jax import readers

DATA_DIR = pathlib.Path(__file__).resolve().parent / 'data'
TASK_INFO = {  # task: (metric, category, language)
    'narrativeqa': ('qa_f1', 'single-doc QA', 'en'),
    'qasper': ('qa_f1', 'single-doc QA', 'en'),
    'multifieldqa_en': ('qa_f1', 'single-doc QA', 'en'),
    'multifieldqa_zh': ('qa_f1_zh', 'single-doc QA', 'zh'),
    'hotpotqa': ('qa_f1', 'multi-doc QA', 'en'),
    '2wikimqa': ('qa_f1', 'multi-doc QA', 'en'),
    'musique': ('qa_f1', 'multi-doc QA', 'en'),
    'dureader': ('rouge_zh', 'multi-doc QA', 'zh'),
    'gov_report': ('rouge', 'summarization', 'en'),
    'qmsum': ('rouge', 'summarization', 'en'),
    'multi_news': ('rouge', 'summarization', 'en'),
    'vcsum': ('rouge_zh', 'summarization', 'zh'),
    'trec': ('classification', 'few-shot', 'en'),
    'triviaqa': ('qa_f1', 'few-shot', 'en'),
    'samsum': ('rouge', 'few-shot', 'en'),
    'lsht': ('classification', 'few-shot', 'zh'),
    'passage_count': ('count', 'synthetic', 'en'),
    'passage_retrieval_en': ('retrieval', 'synthetic', 'en'),
    'passage_retrieval_zh': ('retrieval_zh', 'synthetic', 'zh'),
    'lcc': ('code_sim', 'code', 'code'),
    'repobench-p': ('code_sim', 'code', 'code'),
}
TASKS = tuple(TASK_INFO)
NO_CHAT_TASKS = ('trec', 'triviaqa', 'samsum', 'lsht', 'lcc', 'repobench-p')  # few-shot / completion: raw text
FIRST_LINE_TASKS = ('trec', 'triviaqa', 'samsum', 'lsht')
FIELDS = ('input', 'context', 'answers', 'length', 'all_classes', 'language', '_id')


@functools.cache
def _config(name: str) -> dict:
  with open(DATA_DIR / name, encoding='utf-8') as f:
    return json.load(f)


def _check_task(task: str):
  if task not in TASK_INFO:
    raise ValueError(f'unknown LongBench task {task!r}: choose from {", ".join(TASKS)}')


def max_new_tokens(task: str) -> int:
  _check_task(task)
  return _config('dataset2maxlen.json')[task]


def read_jsonl(path: str) -> list[dict]:
  """Samples of one task file in the official format; names the file and line of anything malformed."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'LongBench file {path!r} does not exist (expected official-format JSONL)')
  return readers.read_jsonl(path, 'LongBench file', dict.fromkeys(('input', 'context', 'answers')),
                            f'LongBench fields: {FIELDS}')


def build_prompt(task: str, sample: dict) -> str:
  """The task's template filled with the sample's `context` and `input` (before truncation and chat wrapper)."""
  _check_task(task)
  return _config('dataset2prompt.json')[task].format(context=sample['context'], input=sample['input'])


def truncate_middle(prompt: str, max_length: int, encode: Callable[[str], Sequence[int]],
                    decode: Callable[[Sequence[int]], str]) -> str:
  """LongBench's truncation: over `max_length` tokens, keep the first and last int(max_length/2) tokens.

  `encode` should add the tokenizer's default special tokens (a BOS counts, as in `pred.py`); `decode` should
  skip special tokens. The halves are decoded separately and joined with nothing between them.
  """
  ids = list(encode(prompt))
  if len(ids) <= max_length:
    return prompt
  half = int(max_length / 2)
  return decode(ids[:half]) + decode(ids[-half:] if half else [])


def prepare(task: str, sample: dict, *, max_length: int, encode, decode,
            chat: Callable[[str], str] | None = None) -> dict:
  """{'prompt', 'max_new_tokens', 'answers', 'all_classes', 'length', '_id'} ready for greedy generation.

  Truncation happens before the chat wrapper; `chat` (the model's instruction format) is skipped for the six
  few-shot / completion tasks, as in `pred.py`. samsum should also stop at a newline (see the LongBench README).
  """
  prompt = truncate_middle(build_prompt(task, sample), max_length, encode, decode)
  if chat is not None and task not in NO_CHAT_TASKS:
    prompt = chat(prompt)
  return {'prompt': prompt, 'max_new_tokens': max_new_tokens(task), 'answers': sample['answers'],
          'all_classes': sample.get('all_classes'), 'length': sample.get('length'), '_id': sample.get('_id')}


# ------------------------------------------------------------------------------------------------ metrics

_ZH_PUNCTUATION = ('！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿'
                   '–—‘’‛“”„‟…‧﹏.')
_EN_PUNCT = frozenset(string.punctuation)
_ZH_PUNCT = frozenset(string.punctuation + _ZH_PUNCTUATION)
_ARTICLES = re.compile(r'\b(a|an|the)\b')


def normalize_answer(text: str) -> str:
  """Lowercase, drop ASCII punctuation, articles to spaces, collapse whitespace (SQuAD-style, as LongBench)."""
  text = ''.join(ch for ch in text.lower() if ch not in _EN_PUNCT)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def normalize_zh_answer(text: str) -> str:
  """Lowercase, drop ASCII and Chinese/full-width punctuation, delete all whitespace."""
  return ''.join(''.join(ch for ch in text.lower() if ch not in _ZH_PUNCT).split())


def f1_tokens(prediction: Sequence[str], reference: Sequence[str]) -> float:
  """F1 over token multisets; 0 when nothing overlaps (an empty prediction too)."""
  same = sum((collections.Counter(prediction) & collections.Counter(reference)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(prediction), same / len(reference)
  return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, answer: str, **_) -> float:
  return f1_tokens(normalize_answer(prediction).split(), normalize_answer(answer).split())


def _jieba_cut(text: str) -> list[str]:
  import jieba  # pylint: disable=g-import-not-at-top
  jieba.setLogLevel(60)  # jieba logs its dictionary loading at INFO
  return list(jieba.cut(text, cut_all=False))


def qa_f1_zh(prediction: str, answer: str, **_) -> float:
  """Segments the raw strings with jieba, then normalises each token and drops empty ones."""
  tokens = lambda s: [t for t in (normalize_zh_answer(w) for w in _jieba_cut(s)) if t]
  return f1_tokens(tokens(prediction), tokens(answer))


# The official scorer calls Rouge.get_scores from 3 Python frames deep (eval.py's module, scorer, rouge_score)
# under the default recursion limit of 1000. The `rouge` package backtracks its LCS recursively, so long
# sentence pairs raise RecursionError there and score 0. We run it at that same virtual depth.
_OFFICIAL_FRAMES_ABOVE_GET_SCORES = 3
_OFFICIAL_RECURSION_LIMIT = 1000
_rouge_lock = threading.Lock()


def _depth() -> int:
  frame, depth = sys._getframe(1), 0  # pylint: disable=protected-access
  while frame is not None:
    depth += 1
    frame = frame.f_back
  return depth


def rouge_l(prediction: str, answer: str, **_) -> float:
  """ROUGE-L F of the `rouge` package, as LongBench calls it: any error (empty prediction, dots only, too-deep
  LCS backtracking) scores 0. Case-sensitive; sentences split on '.'."""
  from rouge import Rouge  # pylint: disable=g-import-not-at-top
  with _rouge_lock:
    old = sys.getrecursionlimit()
    # Frames above get_scores here: this function and its callers; match the official count.
    sys.setrecursionlimit(_OFFICIAL_RECURSION_LIMIT + _depth() - _OFFICIAL_FRAMES_ABOVE_GET_SCORES)
    try:
      return Rouge().get_scores([prediction], [answer], avg=True)['rouge-l']['f']
    except Exception:  # pylint: disable=broad-except  (the official scorer's bare except)
      return 0.0
    finally:
      sys.setrecursionlimit(old)


def rouge_l_zh(prediction: str, answer: str, **_) -> float:
  return rouge_l(' '.join(_jieba_cut(prediction)), ' '.join(_jieba_cut(answer)))


def classification(prediction: str, answer: str, *, all_classes: Sequence[str], **_) -> float:
  """Share of credit among matched class names; keeps the official loop's skip-after-delete behaviour."""
  if all_classes is None:
    raise ValueError('classification needs the sample\'s all_classes list (from the task\'s JSONL)')
  matched = [c for c in all_classes if c in prediction]
  i = 0
  while i < len(matched):  # Deleting while stepping the index skips the element after each deleted one.
    term = matched[i]
    if term in answer and term != answer:
      matched.remove(term)
    i += 1
  return 1.0 / len(matched) if answer in matched else 0.0


def _digit_fraction(prediction: str, gold: str) -> float:
  numbers = re.findall(r'\d+', prediction)
  return sum(n == gold for n in numbers) / len(numbers) if numbers else 0.0


def retrieval(prediction: str, answer: str, **_) -> float:
  return _digit_fraction(prediction, re.findall(r'Paragraph (\d+)', answer)[0])


def retrieval_zh(prediction: str, answer: str, **_) -> float:
  return _digit_fraction(prediction, re.findall(r'段落(\d+)', answer)[0])


def count(prediction: str, answer: str, **_) -> float:
  return _digit_fraction(prediction, str(answer))


def fuzz_ratio(a: str | None, b: str | None, backend: str = 'levenshtein') -> int:
  """fuzzywuzzy's `fuzz.ratio`: None -> 0, equal -> 100, empty -> 0, else round(100 * ratio) (ties to even).

  'levenshtein' is python-Levenshtein's ratio (what `rapidfuzz` computes), 'difflib' fuzzywuzzy's pure fallback.
  """
  if a is None or b is None:
    return 0
  if a == b:
    return 100
  if not a or not b:
    return 0
  if backend == 'levenshtein':
    from rapidfuzz.distance import Indel  # pylint: disable=g-import-not-at-top
    total = len(a) + len(b)
    ratio = (total - Indel.distance(a, b)) / total
  elif backend == 'difflib':
    import difflib  # pylint: disable=g-import-not-at-top
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
  else:
    raise ValueError(f"backend={backend!r} is invalid: use 'levenshtein' or 'difflib'")
  return int(round(100 * ratio))


def code_sim(prediction: str, answer: str, *, backend: str = 'levenshtein', **_) -> float:
  """Edit similarity of the first prediction line free of '`', '#' and '//' (indentation kept) to the answer."""
  line = next((l for l in prediction.lstrip('\n').split('\n') if '`' not in l and '#' not in l and '//' not in l),
              '')
  return fuzz_ratio(line, answer, backend) / 100


METRICS = {'qa_f1': qa_f1, 'qa_f1_zh': qa_f1_zh, 'rouge': rouge_l, 'rouge_zh': rouge_l_zh,
           'classification': classification, 'retrieval': retrieval, 'retrieval_zh': retrieval_zh, 'count': count,
           'code_sim': code_sim}


def score_sample(task: str, prediction: str, answers: Sequence[str], all_classes=None, **kwargs) -> float:
  """Max over the gold answers of the task's metric (0-1), after the first-line rule of the few-shot tasks."""
  _check_task(task)
  if task in FIRST_LINE_TASKS:
    prediction = prediction.lstrip('\n').split('\n')[0]
  metric = METRICS[TASK_INFO[task][0]]
  score = 0.0
  for answer in answers:
    score = max(score, metric(prediction, answer, all_classes=all_classes, **kwargs))
  return score


def score_task(task: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], all_classes=None,
               **kwargs) -> float:
  """Dataset score: round(100 x mean of per-sample scores, 2), as `eval.py`'s scorer."""
  if len(predictions) != len(answers) or not predictions:
    raise ValueError(f'{len(predictions)} predictions for {len(answers)} answer lists (need at least one)')
  total = sum(score_sample(task, p, a, all_classes, **kwargs) for p, a in zip(predictions, answers))
  return round(100 * total / len(predictions), 2)


def score_task_e(task: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], lengths: Sequence[int],
                 all_classes=None, **kwargs) -> dict:
  """LongBench-E: scores by `length` bucket ('0-4k', '4-8k', '8k+'); NaN for an empty bucket."""
  buckets = {'0-4k': [], '4-8k': [], '8k+': []}
  for p, a, n in zip(predictions, answers, lengths):
    key = '0-4k' if n < 4000 else '4-8k' if n < 8000 else '8k+'
    buckets[key].append(score_sample(task, p, a, all_classes, **kwargs))
  return {k: round(100 * sum(v) / len(v), 2) if v else float('nan') for k, v in buckets.items()}


def averages(task_scores: dict[str, float]) -> dict:
  """Official leaderboard averages (mean of category means) plus plain means over the given tasks.

  'en' averages the English categories; 'zh' the Chinese ones plus the shared code category, as the LongBench
  README tables do. A category with no scored task is left out.
  """
  for task in task_scores:
    _check_task(task)
  categories = collections.defaultdict(list)
  by_language = {'en': collections.defaultdict(list), 'zh': collections.defaultdict(list)}
  for task, score in task_scores.items():
    _, category, language = TASK_INFO[task]
    categories[category].append(score)
    for lang in (('en', 'zh') if language == 'code' else (language,)):
      by_language[lang][category].append(score)
  mean = lambda v: sum(v) / len(v)
  out = {'categories': {c: round(mean(v), 2) for c, v in categories.items()},
         'plain_mean': round(mean(list(task_scores.values())), 2) if task_scores else float('nan')}
  for lang, cats in by_language.items():
    out[lang] = round(mean([mean(v) for v in cats.values()]), 2) if cats else float('nan')
  return out
