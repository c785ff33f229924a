"""The training program (``python -m gossip_powersgd.cli.train``) whose peers VICTIMS SIGKILL
themselves at the start of their K-th evaluation, log record or checkpoint, for
tests/comm/test_torch_members.py (a peer lost outside the gossip step):

    python tests/support/churn_moment.py MOMENT K VICTIMS ARGS...

MOMENT is eval, log or checkpoint; VICTIMS one id or several (`1+4`); ARGS the training CLI's.
"""

from __future__ import annotations

import os
import signal
import sys

#: The function of `training/session.py` each moment starts with (looked up at each call, so
#: replaceable).
FUNCTIONS = {"eval": "eval_record", "log": "log_record", "checkpoint": "_save"}


def dying_at(module, name: str, call: int) -> None:
    """Make `module.name` SIGKILL this process at the start of its `call`-th call."""
    original, calls = getattr(module, name), [0]

    def dying(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(module, name, dying)


if __name__ == "__main__":
    moment, call, victims, *argv = sys.argv[1:]
    if int(os.environ["RANK"]) in {int(v) for v in victims.split("+")}:
        from gossip_powersgd.training import session

        dying_at(session, FUNCTIONS[moment], int(call))
    from gossip_powersgd.cli.train import main

    main(argv)
