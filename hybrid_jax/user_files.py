"""The one boundary between the Python files users write (config files, sweep files) and this package.

A config or sweep file is code, not data: it can fail to import, raise, take the wrong arguments or return the wrong
thing. Each of those ends here as one ConfigError that names the file, the line in it, the function and what went
wrong (the user's frame, never ours), so `python -m hybrid_jax` prints one `error:` line instead of a traceback
through the package. A UserError raised inside the file (e.g. the project's own argument checks) passes unchanged.
"""

import importlib.machinery
import importlib.util
import inspect
import pathlib
import traceback

from hybrid_jax.errors import ConfigError, UserError

# What a user's code may raise that this boundary turns into one line: everything but an interrupt (SystemExit
# included: a file that calls sys.exit or parses flags at import).
_CAUGHT = (Exception, SystemExit)


def _where(error: BaseException, file: pathlib.Path) -> str:
  """':LINE' of the innermost frame of `error`'s traceback that runs in `file` ('' when none does)."""
  target = file.resolve()
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if frame.filename and pathlib.Path(frame.filename).resolve() == target]
  return f':{lines[-1]}' if lines else ''


def _describe(error: BaseException) -> str:
  message = str(error).strip().splitlines()
  return f'{type(error).__name__}: {message[0]}' if message else type(error).__name__


def load_python_file(path, kind: str):
  """Executes the Python file at `path` as a fresh module (config and sweep files are code, not imports)."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise ConfigError(f'{kind} file {str(path)!r} does not exist' if not file.exists() else
                      f'{kind} file {str(path)!r} is a directory, not a Python file')
  name = f'_hybrid_jax_{kind}_{file.stem}'  # An explicit loader: any file name is read as Python, not only *.py.
  module_spec = importlib.util.spec_from_file_location(name, file, loader=importlib.machinery.SourceFileLoader(
      name, str(file)))
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except UserError:
    raise
  except (SyntaxError, UnicodeDecodeError) as e:  # Not Python text.
    where = f':{e.lineno}' if isinstance(e, SyntaxError) and e.lineno else ''
    raise ConfigError(f'{kind} file {str(path)!r}{where} is not valid Python: {type(e).__name__}: '
                      f'{getattr(e, "msg", None) or e}') from None
  except OSError as e:  # Unreadable (permissions, a device).
    raise ConfigError(f'{kind} file {str(path)!r} cannot be read: {e.strerror or e}') from None
  except _CAUGHT as e:
    raise ConfigError(f'{kind} file {str(path)!r}{_where(e, file)} failed while loading: {_describe(e)}') from e
  return module


def _arguments(fn, name: str, arg, what: str) -> tuple:
  """The arguments `fn` is called with: (arg,) when an argument was given, else () or (None,), whichever its
  signature takes (absl's config files define `get_config()`; this project's take `get_config(arg=None)`)."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):  # No signature to read (a builtin): call it as given.
    return (arg,)
  for args in ([(arg,)] if arg is not None else [(), (None,)]):
    try:
      signature.bind(*args)
      return args
    except TypeError:
      continue
  if arg is None:
    raise ConfigError(f'{what}: {name}{signature} needs an argument: give one after the file name (FILE:ARG)')
  raise ConfigError(f'{what}: {name}{signature} takes no argument, but {arg!r} was given (drop ":{arg}")')


def call_file_function(module, name: str, arg, what: str, returns: tuple, expected: str):
  """`module.name(arg)` of a config or sweep file, whose result must be an instance of `returns` (`expected` says
  what is allowed, for the error). Anything the function raises, or a wrong result, is one ConfigError naming
  `what` (e.g. "config file 'my.py'"), the line of the file and the call."""
  fn = getattr(module, name, None)
  if not callable(fn):
    raise ConfigError(f'{what} defines no {name}(arg) function')
  args = _arguments(fn, name, arg, what)
  call = f'{name}({", ".join(map(repr, args))})'
  try:
    result = fn(*args)
  except UserError:
    raise
  except _CAUGHT as e:
    file = pathlib.Path(module.__file__)
    raise ConfigError(f'{what}{_where(e, file)} in {call}: {_describe(e)}') from e
  if not isinstance(result, returns):
    raise ConfigError(f'{what}: {call} returned {type(result).__name__} {_short(result)}; expected {expected}')
  return result


def _short(value, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'
