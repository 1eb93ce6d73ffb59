"""The test session's own settings: the files conftest sends to the workers first exist and go first."""

from tests import conftest


def test_the_slow_files_exist_and_are_collected_first(request):
  for name in conftest.SLOW_FILES:
    assert (conftest.ROOT / 'tests' / name).is_file(), f'SLOW_FILES names {name}, which is not in tests/'
  files = list(dict.fromkeys(item.path.name for item in request.session.items))
  listed = [f for f in files if f in conftest.SLOW_FILES]
  assert files[:len(listed)] == listed, files[:len(listed)]
  assert listed == [f for f in conftest.SLOW_FILES if f in listed]
