"""Walking the command line in this process: every command's parser, and one command run as `python -m hybrid_jax`
would run it (hybrid_jax.commands.main), for the generated bad-input tests."""

import argparse
import contextlib

import pytest

from hybrid_jax import commands
from hybrid_jax.commands import parsing


class Accepted(Exception):
  """A parser accepted the arguments: with a bad value that means the check is missing."""


@contextlib.contextmanager
def parsers_seen(stop_at=None):
  """Records every parsing.ArgumentParser that parses; raises Accepted once the parser `stop_at` accepts."""
  seen, original = [], parsing.ArgumentParser.parse_known_args

  def parse_known_args(self, args=None, namespace=None):
    seen.append(self)
    result = original(self, args, namespace)
    if self.prog == stop_at:
      raise Accepted(f'{self.prog} accepted {args}')
    return result

  parsing.ArgumentParser.parse_known_args = parse_known_args
  try:
    yield seen
  finally:
    parsing.ArgumentParser.parse_known_args = original


def run_main(argv, capsys):
  """(exit status, stderr) of `python -m hybrid_jax ARGV` run in this process."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    commands.main(['hybrid_jax', *argv])
  return exit_info.value.code, capsys.readouterr().err


def assert_one_line(status, err, *fragments):
  lines = err.strip().splitlines()
  assert status == 2 and len(lines) == 1 and lines[0].startswith('error: '), (status, err)
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def sub_commands(parser):
  """Sub-command names of a parser: argparse sub-parsers, or a NAME choice followed by the rest of the line."""
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      return list(action.choices)
  positionals = [a for a in parser._actions if not a.option_strings]  # pylint: disable=protected-access
  if len(positionals) == 2 and positionals[0].choices and positionals[1].nargs == argparse.REMAINDER:
    return list(positionals[0].choices)
  return []


def leaf_parsers(capsys):
  """{command words: parser} of every command and sub-command, found through their --help."""
  found, todo = {}, [[c] for c in [*commands.COMMANDS]]
  while todo:
    words = todo.pop()
    with parsers_seen() as seen:
      status, _ = run_main([*words, '--help'], capsys)
    assert status == 0, words
    parser = seen[-1]
    assert parser.prog == 'python -m hybrid_jax ' + ' '.join(words), parser.prog
    children = sub_commands(parser)
    todo += [[*words, child] for child in children]
    if not children:
      found[tuple(words)] = parser
  return found
