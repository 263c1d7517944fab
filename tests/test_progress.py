"""The run's progress display: ETA from steady rounds, the step bar, the compile lines."""

import io
import sys

import pytest

from fedjax_mtl import progress


def test_eta_uses_steady_rounds_and_the_extra_of_evaluating_rounds():
  # Round 1 (compiling on a streamed feed) is left out of the plain median.
  assert progress.eta_seconds([(60., False)], 7, 2) is None
  times = [(60., False), (4., False), (6., False), (9., True)]
  # plain median 5 s; an evaluating round costs 9 - 5 = 4 s more.
  assert progress.eta_seconds(times, 4, 1) == pytest.approx(4 * 5 + 1 * 4)
  assert progress.eta_seconds(times, 0, 0) == 0
  # Evaluations without a timed evaluating round: plain rounds only.
  assert progress.eta_seconds(times[:3], 3, 1) == pytest.approx(15)


def test_progress_bar_counts_steps_and_ends_done(monkeypatch, capsys):
  err = io.StringIO()
  monkeypatch.setattr(sys, 'stderr', err)
  p = progress.Progress('fedavg 6 clients', total=3, start=0, eval_rounds={3},
                        steps_per_round=10, steps_bar=True)
  assert p.step_callback() == p.steps  # a step bar: the feed reports each group
  assert progress.Progress('x', 3, 0, set(), 10, steps_bar=False).step_callback() is None
  p.compiling(['train pascal x5', 'aggregate'], None)
  p.compiled({'train pascal x5': 1.5, 'aggregate': 0.5})
  etas = []
  with p:
    for rnd in (1, 2, 3):
      p.round_start(rnd)
      p.steps(6)
      p.steps(4)
      assert p.step.n == 10
      p.round_end(rnd, 1.0, rnd == 3, f'round {rnd}/3')
      assert p.step is None
      etas.append(p.bar.postfix)
  text = err.getvalue()
  assert 'compiling 2 programs (train pascal x5, aggregate); no compilation cache' in text
  assert 'compiled in 2.0s (train pascal x5 1.5s, aggregate 0.5s)' in text
  # After round 1 no steady round exists; after round 2 one round (1 s) is left.
  assert etas == ['ETA …', 'ETA 0:01', 'done'] and 'done]' in text
  assert [l for l in capsys.readouterr().out.splitlines()] == ['round 1/3', 'round 2/3',
                                                                'round 3/3']
