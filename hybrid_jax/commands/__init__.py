"""Command-line entry: `python -m hybrid_jax <command> [flags]`; `python -m hybrid_jax --help` lists the commands.

The command line's one home. Each command is one module of this package with `main(argv)`, whose docstring's first
line is its summary in `python -m hybrid_jax --help`; `main` below finds and runs it. Every command parses its own
flags with the argparse style of `parsing` (`--help` lists them with their defaults) and `parsing.run` turns bad
input into one `error: …` line with exit status 2, so the domain packages below hold no argument parsing. The
commands that read a config take `--config=FILE[:ARG]` and any number of `--config.KEY=VALUE` overrides
(`config_flags`), and validate it before anything compiles.
"""

import ast
import importlib
import pathlib
import pkgutil
import sys

from hybrid_jax import host_memory
from hybrid_jax.commands import parsing


def _commands() -> dict[str, tuple[str, str]]:
  """Command name -> (its module, its summary): every module of this package that defines `main(argv)`, named by
  the module with '-' for '_' (compile_check -> compile-check), summarised by the first line of main's docstring.
  Read from the source, so listing the commands imports none of them. A new command is one file here."""
  folder, found = pathlib.Path(__path__[0]), {}
  for info in pkgutil.iter_modules(__path__):
    tree = ast.parse((folder / f'{info.name}.py').read_text())
    main_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'main'), None)
    if main_fn is not None:
      found[info.name.replace('_', '-')] = (f'{__name__}.{info.name}', ast.get_docstring(main_fn).splitlines()[0])
  return found


COMMANDS = _commands()


def _command_list() -> str:
  lines = ['commands (python -m hybrid_jax COMMAND --help lists its flags):']
  lines += [f'  {name:14s} {summary}' for name, (_, summary) in COMMANDS.items()]
  return '\n'.join(lines)


def _top_parser():
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax', description=__doc__.splitlines()[0],
                                  epilog=_command_list())
  parser.add_argument('command', metavar='COMMAND', choices=list(COMMANDS), help='one of the commands below')
  parser.add_argument('args', nargs='...', help="the command's flags")
  return parser


def main(argv=None):
  host_memory.keep_freed_memory()  # Before any array exists: on a CPU each step then reuses its buffers.
  argv = list(sys.argv if argv is None else argv)
  args = _top_parser().parse_args(argv[1:])
  module = importlib.import_module(COMMANDS[args.command][0])
  sys.exit(parsing.run(module.main, args.args))
