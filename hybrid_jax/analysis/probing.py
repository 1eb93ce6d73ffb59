"""Layer-wise probing: at which layer does the needle's value become linearly readable at the last prompt token?

Data: the study's generator (needles.study_samples): one needle whose value is one of 8 candidates (the label),
depth uniform in [1/4, 3/4], repeated-filler or essay haystack. Features per layer l: the residual stream at the
last prompt token after block l ('residual'), and block l's own contribution, output minus input ('delta').
Probe: scikit-learn logistic regression on standardised features, C = 0.1, an 80/20 stratified split with
seed 42; the score is test accuracy (chance = 1 / number of candidates).
"""

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import needles, report
from hybrid_jax.errors import InputError

FEATURES = ('residual', 'delta')


def probe_accuracy(features, labels, *, c: float = 0.1, test_size: float = 0.2, seed: int = 42) -> float:
  """Test accuracy of a standardised logistic-regression probe (stratified split)."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top  (heavy import)
  from sklearn.model_selection import train_test_split
  from sklearn.pipeline import make_pipeline
  from sklearn.preprocessing import StandardScaler
  features, labels = np.asarray(features, np.float64), np.asarray(labels)
  if len(features) != len(labels):
    raise ValueError(f'{len(features)} feature rows for {len(labels)} labels')
  x_train, x_test, y_train, y_test = train_test_split(features, labels, test_size=test_size, stratify=labels,
                                                      random_state=seed)
  model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
  model.fit(x_train, y_train)
  return float(model.score(x_test, y_test))


def residuals(model_def, params, encoded, *, pad_id: int, batch_size: int = 8, progress: bool = False):
  """Residual stream at each sample's last prompt token: [N, L + 1, d] (entry 0: embeddings)."""
  fn = jax.jit(lambda p, tokens, pos: forward_lib.forward(model_def.bind(p), tokens, residual_positions=pos,
                                                          logit_positions=pos)['residuals'])
  out = []
  chunks = [encoded[i:i + batch_size] for i in range(0, len(encoded), batch_size)]
  for chunk in tqdm.tqdm(chunks, desc='features', disable=not progress, leave=False):
    b = needles.batch(chunk, pad_id=pad_id)
    pos = jnp.asarray(b['prompt_len'][:, None] - 1)
    out.append(np.asarray(fn(params, jnp.asarray(b['tokens']), pos))[:, :, 0].transpose(1, 0, 2))
  return np.concatenate(out)


def probe_layers(stream, labels, *, seed: int = 42) -> dict:
  """{'residual': [acc per layer], 'delta': [acc per layer]} from a residual stream [N, L + 1, d]."""
  n_layers = stream.shape[1] - 1
  return {'residual': [probe_accuracy(stream[:, l + 1], labels, seed=seed) for l in range(n_layers)],
          'delta': [probe_accuracy(stream[:, l + 1] - stream[:, l], labels, seed=seed) for l in range(n_layers)]}


def plot(result: dict, path, *, title: str = 'Layer-wise probing') -> str:
  fig = report.figure(7, 3.6)
  ax = fig.subplots()
  layers = [l['index'] for l in result['layers']]
  for feature in FEATURES:
    ax.plot(layers, result[feature], marker='o', label=feature)
  for l in result['layers']:
    if l['role'] == 'full':
      ax.axvspan(l['index'] - 0.4, l['index'] + 0.4, color='tab:red', alpha=0.12, linewidth=0)
  ax.axhline(result['chance'], color='black', linestyle=':', label='chance')
  ax.set_xticks(layers, [f"{l['index']}\n{l['kind']}" for l in result['layers']], fontsize=7)
  ax.set(xlabel='layer (shaded: full attention)', ylabel='probe accuracy', title=title, ylim=(0, 1.05))
  ax.legend(fontsize=7)
  return str(report.save(fig, path))


def run(run, *, num_samples: int = 400, length: int | None = None, haystack: str = 'repeat', seed: int = 42,
        values=needles.STUDY_VALUES, batch_size: int = 8, out=None, progress: bool = True) -> dict:
  """The tool: `probing.json` and `probing.png` in the run's analysis folder."""
  if len(values) < 2:
    raise InputError('probing needs at least 2 candidate values')
  if num_samples < 5 * len(values):
    raise InputError(f'num_samples={num_samples} is too few for {len(values)} classes and a 20% stratified test '
                     f'split: use at least {5 * len(values)}')
  tokenizer = run.tokenizer
  length = length or int(run.config.data.seq_len)
  samples = needles.study_samples(num_samples, length=length, tokenizer=tokenizer, seed=seed, values=tuple(values),
                                  haystack=haystack)
  encoded = [needles.encode(s, tokenizer) for s in samples]
  labels = np.asarray([s['label'] for s in samples])
  stream = residuals(run.model_def, run.params, encoded, pad_id=tokenizer.eos_id, batch_size=batch_size,
                     progress=progress)
  result = probe_layers(stream, labels, seed=seed)
  result.update(
      layers=[{'index': l.index, 'kind': l.kind, 'role': l.role} for l in forward_lib.layers(run.config.model)],
      chance=1.0 / len(values), values=list(values), num_samples=num_samples, length=length, haystack=haystack,
      seed=seed, probe={'model': 'LogisticRegression', 'C': 0.1, 'standardised': True, 'test_size': 0.2},
      workdir=str(run.workdir), step=run.step)
  directory = report.output_dir(run.workdir, out)
  result['plot'] = plot(result, directory / 'probing.png', title=f'Layer-wise probing (step {run.step})')
  result['json'] = str(report.write_json(directory / 'probing.json', result))
  return result
