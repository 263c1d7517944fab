"""`python scripts/bench.py` is `python -m benchmarks` (benchmarks/__main__.py, one module
per subject under benchmarks/): the same flags, --only choices, printed figures and
--json file; it runs from any directory.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from benchmarks.__main__ import main  # noqa: E402

if __name__ == '__main__':
  main(sys.argv[1:], epilog=__doc__)
