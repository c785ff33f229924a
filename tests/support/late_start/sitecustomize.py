"""With this folder on PYTHONPATH and GOSSIP_TEST_LATE="RANK:SECONDS", the interpreter of torchrun's
worker RANK starts SECONDS late (still importing, as on a loaded machine), its command line unchanged:
for tests/faults/test_monitor.py, where torchrun ends every worker once the first has exited."""

import os
import time

_late = os.environ.get("GOSSIP_TEST_LATE", "")
if _late and os.environ.get("RANK") == _late.split(":")[0]:
    time.sleep(float(_late.split(":")[1]))
