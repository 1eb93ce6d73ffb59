"""Hooks of the training loop: cadences declared where a hook is wired, a hook that stops the run early (and what a
rerun does then), the stop once retrieval has formed, and the config keys of both."""

import json

import pytest

from hybrid_jax import standard_hooks
from hybrid_jax.analysis import callbacks
from hybrid_jax.config import ConfigError, validate
from hybrid_jax.train import checkpoint, early_stop, hooks, loop, metrics
from tests.conftest import small_config, train_command


class Recorder(hooks.Hook):
  """Notes when the loop calls it; stops the run after step `stop_at` (None: never)."""

  def __init__(self, stop_at=None):
    self.stop_at, self.began, self.before, self.after, self.ended = stop_at, [], [], [], []

  def begin(self, step):
    self.began.append(step)

  def before_step(self, completed):
    self.before.append(completed)

  def after_step(self, step, state, batch):
    self.after.append(step)
    return hooks.Stop(f'asked at step {step}') if step == self.stop_at else None

  def at_end(self, step, params):
    self.ended.append(step)
    return {'ended_at': step}


def _train_records(workdir):
  return [r for r in metrics.read_jsonl(workdir / 'metrics.jsonl') if r['kind'] == 'train']


def _checkpoints(workdir):
  return checkpoint.Checkpointer(workdir / 'checkpoints', keep=3, async_save=False).all_steps()


def test_cadences():
  assert [s for s in range(1, 13) if hooks.Cadence(3)(s)] == [3, 6, 9, 12]
  assert not any(hooks.Cadence(0)(s) for s in range(1, 100))  # 0 = never.
  dense = hooks.Cadence(250, dense_every=50, dense_until=200)
  assert [s for s in range(1, 1001) if dense(s)] == [50, 100, 150, 200, 250, 500, 750, 1000]
  odd = hooks.Cadence(4, dense_every=3, dense_until=7)  # Up to 7 only multiples of 3, then only multiples of 4.
  assert [s for s in range(1, 17) if odd(s)] == [3, 6, 8, 12, 16]
  assert [s for s in range(1, 13) if hooks.Cadence(3, last=8)(s)] == [3, 6]
  assert [s for s in range(1, 13) if hooks.window(5, 7, hooks.Hook()).due(s)] == [5, 6, 7]


def test_the_loop_runs_each_hook_at_its_cadence_only(tmp_path):
  c = small_config()
  c.train.update(steps=9, checkpoint_every=9)
  every_3, dense, profiled, always = Recorder(), Recorder(), Recorder(), Recorder()
  wired = [hooks.every(3, every_3), hooks.every(4, dense, dense_every=1, dense_until=2), hooks.window(5, 6, profiled),
           always]
  result = loop.train(c, tmp_path, hooks=lambda context: wired)
  assert every_3.after == [3, 6, 9] and every_3.before == [2, 5, 8]
  assert dense.after == [1, 2, 4, 8]
  assert profiled.before == [4, 5] and profiled.after == [5, 6]
  assert always.after == list(range(1, 10))
  assert every_3.began == [0] and every_3.ended == [9]  # begin and at_end ignore the cadence.
  assert result['stopped_early'] is None and result['eval'] == {'ended_at': 9}


def test_a_hook_stops_the_run_early_and_a_rerun_finds_it_finished(tmp_path):
  c = small_config()
  c.train.update(steps=20, checkpoint_every=4)
  hook = Recorder(stop_at=5)
  result = loop.train(c, tmp_path, hooks=lambda context: [hook])
  assert result['status'] == 'completed' and result['steps'] == 5
  assert result['stopped_early'] == {'step': 5, 'reason': 'asked at step 5'}
  assert hook.ended == [5] and result['eval'] == {'ended_at': 5}  # at_end runs on an early-stopped run.
  assert _checkpoints(tmp_path) == [4, 5]
  assert json.loads((tmp_path / 'report.json').read_text())['stopped_early'] == result['stopped_early']
  records = _train_records(tmp_path)
  assert [r['step'] for r in records] == [1, 2, 3, 4, 5]
  checkpoint_bytes = {f: f.read_bytes() for f in sorted((tmp_path / 'checkpoints').rglob('*')) if f.is_file()}

  again_hook = Recorder(stop_at=5)
  again = loop.train(c, tmp_path, hooks=lambda context: [again_hook])  # The same command: finished, trains nothing.
  assert again['status'] == 'completed' and again['resumed_from'] == 5 and again['steps'] == 5
  assert again['stopped_early'] == result['stopped_early'] and again_hook.after == [] and again_hook.ended == [5]
  assert _train_records(tmp_path) == records
  assert {f: f.read_bytes() for f in sorted((tmp_path / 'checkpoints').rglob('*')) if f.is_file()} == checkpoint_bytes

  c.train.steps = 22  # A raised cap: the run trains on from its checkpoint.
  raised_hook = Recorder(stop_at=5)
  raised = loop.train(c, tmp_path, hooks=lambda context: [raised_hook])
  assert raised['resumed_from'] == 5 and raised['steps'] == 22 and raised['stopped_early'] is None
  assert raised_hook.after == list(range(6, 23))
  assert [r['step'] for r in _train_records(tmp_path)] == list(range(1, 23))
  assert raised['sessions'][-1]['changes']['train.steps'] == {'from': 20, 'to': 22, 'class': 'training'}


class FakeProbe:
  """The retrieval probe with a scripted metric: `values` in the order probed."""

  def __init__(self, values, name='recall_accuracy_32_64'):
    self.values, self.name, self.calls = list(values), name, 0

  def __call__(self, params):
    del params
    value = self.values[self.calls]
    self.calls += 1
    return {self.name: value, 'recall_accuracy': 0.5}


def _probe_config(steps, **train):
  c = small_config()
  c.eval.documents = 0  # The final evaluation is the packed loss alone: the fastest at_end.
  c.train.update({**dict(steps=steps, checkpoint_every=steps, retrieval_probe_every=4, retrieval_probe_dense_every=2,
                         retrieval_probe_dense_until=8, stop_when_formed='recall_accuracy_32_64'), **train})
  return c


def _probe_steps(workdir):
  return [r['step'] for r in metrics.read_jsonl(workdir / 'metrics.jsonl') if r['kind'] == 'probe']


def test_stop_when_formed_stops_at_the_second_probe_in_a_row_at_the_threshold(tmp_path, monkeypatch):
  """Dense probes every 2 steps up to 8, then every 4: at steps 2, 4, 6, 8, 12, ... the metric reads 0.2, 0.96
  (one probe: not yet), 0.5 (the streak breaks), 0.95 (at the threshold), 0.97: formed at step 12."""
  monkeypatch.setattr(callbacks, 'make_retrieval_probe',
                      lambda *a, **k: FakeProbe([0.2, 0.96, 0.5, 0.95, 0.97, 0.99, 0.99]))
  result = standard_hooks.train(_probe_config(20), tmp_path)
  assert result['status'] == 'completed' and result['steps'] == 12
  assert result['stopped_early']['step'] == 12 and 'steps 8, 12' in result['stopped_early']['reason']
  assert _probe_steps(tmp_path) == [2, 4, 6, 8, 12]
  assert result['eval']['packed_loss'] > 0  # The final evaluation ran.
  assert _checkpoints(tmp_path) == [12]


def test_a_resumed_run_keeps_its_streak_and_one_formed_before_stops_untrained(tmp_path, monkeypatch):
  """The run trained to step 8 (cap 8) with one probe of the streak behind it stops at step 12 when resumed under
  a raised cap, as the uninterrupted run does; trained first without the rule and formed by step 8, it stops at 8."""
  monkeypatch.setattr(callbacks, 'make_retrieval_probe', lambda *a, **k: FakeProbe([0.2, 0.96, 0.5, 0.95]))
  first = standard_hooks.train(_probe_config(8), tmp_path / 'streak')
  assert first['steps'] == 8 and first['stopped_early'] is None
  monkeypatch.setattr(callbacks, 'make_retrieval_probe', lambda *a, **k: FakeProbe([0.97, 0.99]))
  resumed = standard_hooks.train(_probe_config(20), tmp_path / 'streak')
  assert resumed['resumed_from'] == 8 and resumed['stopped_early']['step'] == 12

  monkeypatch.setattr(callbacks, 'make_retrieval_probe', lambda *a, **k: FakeProbe([0.2, 0.5, 0.96, 0.97]))
  standard_hooks.train(_probe_config(8, stop_when_formed=''), tmp_path / 'formed')
  monkeypatch.setattr(callbacks, 'make_retrieval_probe', lambda *a, **k: FakeProbe([]))
  result = standard_hooks.train(_probe_config(20), tmp_path / 'formed')
  assert result['resumed_from'] == 8 and result['steps'] == 8 and result['stopped_early']['step'] == 8
  assert [r['step'] for r in _train_records(tmp_path / 'formed')][-1] == 8
  assert json.loads((tmp_path / 'formed' / early_stop.FILE).read_text())['step'] == 8


@pytest.mark.e2e
def test_two_processes_stop_together_and_a_rerun_finds_the_run_finished(tmp_path):
  """Both processes stop at the same step, exit 0 and checkpoint it: process 0 decides (loop._agreed). The probe's
  own `seconds` stands in for a metric that forms: above 1e-9 at every probe, so formed at the second, step 4."""
  from tests.test_multihost import _log, _processes
  workdir = tmp_path / 'run'
  argv = train_command(workdir, '--config.train.steps=20', '--config.train.checkpoint_every=20',
                       '--config.train.retrieval_probe_every=2', '--config.train.retrieval_probe_samples=1',
                       '--config.train.retrieval_probe_length=256', '--config.train.stop_when_formed=seconds',
                       '--config.train.formed_threshold=1e-9')[3:]
  for _ in range(2):  # The second time finds the run finished.
    procs = _processes(2, argv, tmp_path)
    assert [p.wait(timeout=900) for p in procs] == [0, 0], _log(tmp_path, 0)[-3000:] + _log(tmp_path, 1)[-3000:]
    report = json.loads((workdir / 'report.json').read_text())
    assert report['processes'] == 2 and report['steps'] == 4 and report['stopped_early']['step'] == 4
    assert _checkpoints(workdir) == [4] and _probe_steps(workdir) == [2, 4]
  assert report['resumed_from'] == 4


def test_a_metric_the_probe_does_not_log_is_named_at_the_first_probe(tmp_path, monkeypatch):
  monkeypatch.setattr(callbacks, 'make_retrieval_probe', lambda *a, **k: FakeProbe([0.1]))
  c = _probe_config(8, stop_when_formed='recall_accuracy_32_65')
  with pytest.raises(ConfigError, match=r"stop_when_formed='recall_accuracy_32_65'.*recall_accuracy, "
                                        r'recall_accuracy_32_64'):
    standard_hooks.train(c, tmp_path)
  assert _probe_steps(tmp_path) == [2]


@pytest.mark.parametrize('settings, key', [
    (dict(stop_when_formed='recall_accuracy'), 'stop_when_formed'),  # The probe is off.
    (dict(formed_threshold=0.0), 'formed_threshold'),
    (dict(formed_threshold=float('nan')), 'formed_threshold'),
    (dict(formed_probes=0), 'formed_probes'),
    (dict(retrieval_probe_every=4, retrieval_probe_dense_every=-1, retrieval_probe_dense_until=8),
     'retrieval_probe_dense_every'),
    (dict(retrieval_probe_every=4, retrieval_probe_dense_every=2), 'retrieval_probe_dense_every'),
    (dict(retrieval_probe_every=4, retrieval_probe_dense_until=100), 'retrieval_probe_dense_until'),
    (dict(retrieval_probe_dense_every=2, retrieval_probe_dense_until=8), 'retrieval_probe_dense_every'),
])
def test_the_new_keys_are_validated(settings, key):
  c = small_config()
  c.train.update(settings)
  with pytest.raises(ConfigError, match=rf'^config\.train\.{key}=\S+ is invalid: [^\n]+$'):
    validate(c)


def test_the_defaults_are_off():
  t = validate(small_config()).train
  assert (t.stop_when_formed, t.retrieval_probe_dense_every, t.retrieval_probe_dense_until) == ('', 0, 0)
  assert (t.formed_threshold, t.formed_probes) == (0.95, 2)


def test_the_mini_study_takes_an_early_stop_as_finished_and_a_smaller_cap_as_resumable(tmp_path):
  from hybrid_jax.study import mini
  report = {'status': 'completed', 'steps': 3000, 'stopped_early': {'step': 3000, 'reason': 'formed'}}
  (tmp_path / 'report.json').write_text(json.dumps(report))
  assert mini._finished(tmp_path, 20000) == report
  (tmp_path / 'report.json').write_text(json.dumps({'status': 'completed', 'steps': 5000, 'stopped_early': None}))
  assert mini._finished(tmp_path, 20000) is None and mini._finished(tmp_path, 5000) is not None
  (tmp_path / 'report.json').write_text(json.dumps({'status': 'preempted', 'steps': 5000}))
  assert mini._finished(tmp_path, 5000) is None


def test_mini_resumes_the_5000_step_runs_and_watches_recall_beyond_the_large_window():
  from hybrid_jax.study import mini_scoring, presets
  from hybrid_jax.train import config_history
  mini, converge = presets.PRESETS['mini-5k'], presets.PRESETS['mini']
  for label in converge.arches:
    before, after = presets.run_config(label, mini), presets.run_config(label, converge)
    assert before.name == after.name  # The same run directories.
    changed = config_history.check_resume('run', config_history.flatten(before), config_history.flatten(after))
    assert {k: config_history.key_class(k) for k in changed} == {
        'train.steps': 'training', 'train.stop_when_formed': 'operational',
        'train.retrieval_probe_dense_every': 'operational', 'train.retrieval_probe_dense_until': 'operational'}
    assert not before.train.stop_when_formed and before.train.retrieval_probe_dense_every == 0
  t = presets.run_config('Full', converge).train
  assert t.stop_when_formed == f'recall_accuracy_{mini_scoring.probe_names(converge)[2]}' == 'recall_accuracy_32_56'
  assert (t.steps, t.formed_threshold, t.formed_probes) == (20000, 0.95, 2)
  assert (t.retrieval_probe_dense_every, t.retrieval_probe_dense_until, t.retrieval_probe_every) == (50, 2500, 250)
