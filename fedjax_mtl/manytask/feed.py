"""What each many-task round reads: its slots' sample-index rows and the images they index.

- `many.feed='device'`: every task's training set sits on the device once
  (mini8: 12,000 images of 32², 37 MB); a round gets its slots' rows of the
  index table.
- `many.feed='round'`: only the samples of the round's pairs go to the device,
  gathered on the host each round (the paper's 8 tasks at 224² are about 40 GB
  of uint8 images, while a round of 6 of 30 clients reads about a fifth of
  them). The rows are renumbered into that gathered block, which is padded to
  the largest round's size so one compiled program serves every round. The
  round's computation is the same: a run gives bitwise the same states with
  either feed (test).
"""

from __future__ import annotations

import jax
import numpy as np

from fedjax_mtl.manytask.setting import Setting

FEEDS = ('device', 'round')


class RoundFeed:
  """`feed(r) -> (rows [S, max_n] int32, images, labels)` of round r (0-based)."""

  def __init__(self, setting: Setting, images: np.ndarray, labels: np.ndarray, mode: str,
               put=jax.device_put):
    """`put(host arrays)`: how arrays reach the devices (a multi-device run replicates
    them over its mesh)."""
    if mode not in FEEDS:
      raise ValueError(f'unknown many.feed {mode!r}; valid choices: ' + ', '.join(FEEDS))
    self.mode = mode
    self.setting = setting
    self.put = put
    if mode == 'device':
      self.images, self.labels = put((images, labels))
      return
    self.host_images, self.host_labels = images, labels
    self.unions = [self._union(r) for r in range(setting.schedule.shape[0])]
    self.size = max(1, max(len(u) for u in self.unions))

  def _union(self, r: int) -> np.ndarray:
    st = self.setting
    slots = st.schedule[r]
    used = [st.index_table[p, :st.counts[p]] for p in slots if p < st.num_pairs]
    return np.unique(np.concatenate(used)) if used else np.zeros(0, np.int64)

  def __call__(self, r: int):
    st = self.setting
    rows = st.index_table[st.schedule[r]]
    if self.mode == 'device':
      return self.put(rows), self.images, self.labels
    union = self.unions[r]
    # Rows index the union block; entries past a pair's count are never read.
    local = np.searchsorted(union, rows).clip(0, max(len(union) - 1, 0)).astype(np.int32)
    take = np.zeros(self.size, np.int64)
    take[:len(union)] = union
    return self.put((local, self.host_images[take], self.host_labels[take]))
