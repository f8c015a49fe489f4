"""`epp serve` whose decider carries no learned limits across a change of
decider: `Decider.seed` refuses every report, so a new decider starts its
adaptive gate from `initial` and learns each limit again from the servers.
The "rebuilt" side of `bench.soft_state`.

    python3 -m bench.rebuilt_decider serve ...   (as python3 -m epp serve ...)
"""

import sys

from epp.cli import main
from epp.serve.decider import Decider


def refuse(decider: Decider, epoch: int, limits: object) -> bool:
    return False


Decider.seed = refuse  # type: ignore[method-assign]

sys.exit(main())
