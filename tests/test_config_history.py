"""Which config keys may change on resume (every key classified), the refusal lines, and the config history:
the config in effect at each step, the training changes collect flags, and the resume marks of the loss plot."""

import json

import pytest

from hybrid_jax.train import runs
from hybrid_jax.config import BASE_CONFIG, load_config_file
from hybrid_jax.train import config_history, report
from tests.conftest import small_config


def _every_config():
  from hybrid_jax.configs import hybrid  # pylint: disable=g-import-not-at-top
  yield load_config_file(str(BASE_CONFIG))
  for arch in hybrid.ARCHES:
    for scale in hybrid.SCALES:
      yield load_config_file(f'{hybrid.__file__}:arch={arch},scale={scale}')
  yield load_config_file(f'{hybrid.__file__}:arch=swa128,scale=s1,stage=extend32k,init_from=/r,rope_base=5e5')


def test_every_config_key_is_classified_and_every_class_entry_is_used():
  keys = set()
  for config in _every_config():
    keys |= set(config_history.flatten(config))
  unclassified = sorted(k for k in keys if config_history.key_class(k) is None)
  assert not unclassified, f'add these keys to config_history.KEY_CLASSES: {unclassified}'
  for entry in config_history.KEY_CLASSES:
    prefix = entry[:-1] if entry.endswith('.*') else None
    assert any(k == entry or (prefix and k.startswith(prefix)) for k in keys), f'{entry} names no config key'
  assert config_history.key_class('model.gdn.num_heads') == config_history.IDENTITY  # Through 'model.gdn.*'.
  assert config_history.key_class('parallel.rules.batch') == config_history.OPERATIONAL
  assert config_history.key_class('model.no_such_key') is None


def test_refusal_has_one_line_per_defining_key_and_allowed_changes_pass():
  run = config_history.flatten(small_config())
  new = small_config()
  new.model.d_model, new.data.tokenizer, new.train.lr = 48, 'other.model', 1e-2
  with pytest.raises(config_history.ConfigChangeRefused) as info:
    config_history.check_resume('runs/x', run, config_history.flatten(new))
  lines = str(info.value).splitlines()
  assert lines[1:] == [
      'data.tokenizer: run has "byte", this command says "other.model"; use a new --workdir or drop the override',
      'model.d_model: run has 32, this command says 48; use a new --workdir or drop the override']
  assert 'runs/x' in lines[0]
  new = small_config()
  new.train.lr, new.train.log_every, new.model.cycle = 1e-2, 5, ('swa', 'full')  # A tuple equal to the saved list.
  assert config_history.check_resume('runs/x', run, config_history.flatten(new)) == {
      'train.lr': (3e-3, 1e-2), 'train.log_every': (1, 5)}
  with pytest.raises(config_history.ConfigChangeRefused, match='model.new_key: run has 1, this command says 2'):
    config_history.check_resume('runs/x', {'model.new_key': 1}, {'model.new_key': 2})  # Unclassified: refused.


def _session(first_step, resumed_from, **changes):
  return config_history.session_entry(first_step, resumed_from,
                                      {k.replace('__', '.'): v for k, v in changes.items()})


def test_the_config_of_each_step_follows_the_sessions():
  saved = {'train': {'lr': 0.003, 'steps': 12}, 'model': {'d_model': 32}}
  sessions = [_session(1, None), _session(13, 12, train__lr=(0.003, 0.01), train__steps=(12, 20)),
              _session(17, 16, train__lr=(0.01, 0.001)),
              _session(15, 14, train__lr=(0.001, 0.002))]  # Fell back to checkpoint 14: retrains 15 onward.
  at = {s: config_history.apply(saved, sessions, s)['train']['lr'] for s in (1, 12, 13, 14, 15, 16, 17, 30)}
  assert at == {1: 0.003, 12: 0.003, 13: 0.01, 14: 0.01, 15: 0.002, 16: 0.002, 17: 0.002, 30: 0.002}
  assert config_history.apply(saved, sessions)['train'] == {'lr': 0.002, 'steps': 20}
  assert saved['train']['lr'] == 0.003  # The saved config is left as it was.
  assert config_history.training_changes(sessions) == 'train.lr@13,train.steps@13,train.lr@17,train.lr@15'
  assert config_history.training_changes([_session(13, 12, train__log_every=(1, 5))]) == ''  # Operational.


def test_load_config_gives_the_latest_config_and_config_json_the_first(tmp_path):
  run = tmp_path
  (run / 'config.json').write_text(small_config().to_json_best_effort())
  config_history.write_sessions(run, [_session(1, None), _session(9, 8, train__lr=(0.003, 0.01))])
  assert runs.load_config(run).train.lr == 0.01
  assert json.loads((run / 'config.json').read_text())['train']['lr'] == 0.003
  (run / config_history.HISTORY_FILE).write_text('{"not": "a history"}')
  with pytest.raises(runs.RunError, match=r"config history .*: missing key\(s\) 'sessions'"):
    runs.load_config(run)


def test_loss_plot_marks_each_resume_with_its_changes():
  records = [{'kind': 'train', 'step': s, 'loss': 5.0 - 0.1 * s} for s in range(1, 21)]
  sessions = [_session(1, None), _session(9, 8), _session(13, 12, train__lr=(0.003, 0.01))]
  assert report.resume_marks(sessions) == [(8, 'resumed'), (12, 'resumed: train.lr=0.01')]
  fig = report.loss_figure(records, sessions)
  ax = fig.axes[0]
  vertical = sorted(line.get_xdata()[0] for line in ax.lines if len(set(line.get_xdata())) == 1)
  assert vertical == [8, 12]
  assert {t.get_text() for t in ax.texts} == {'resumed', 'resumed: train.lr=0.01'}
  assert not report.loss_figure(records, sessions[:1]).axes[0].texts  # A run never resumed: no marks.
