"""User-facing errors: one clear line naming the problem and the valid choices."""

from __future__ import annotations

from typing import Iterable


class ConfigError(ValueError):
  """Bad input (config, names, paths, checkpoints); main prints it as one line."""


def check_choice(kind: str, value, choices: Iterable, where: str = '') -> None:
  """Raise ConfigError unless `value` is one of `choices`."""
  choices = list(choices)
  if value not in choices:
    raise ConfigError(
        f'unknown {kind} {value!r}{where}; valid choices: '
        + ', '.join(repr(c) for c in choices))


class DivergedError(ConfigError):
  """A round produced non-finite values; reported like bad input (one `error:` line,
  exit 2), since the cure is a setting (learning rate, data) and the round is not saved."""
