"""The rank supervisor on its own, without mpiexec (tests/faults/test_liveness.py):

    PMI_RANK=3 PMI_SIZE=4 python tests/support/scripts/supervised.py exit CODE | kill | wait

The first process becomes the supervisor and runs this script again as its child, which then
exits with CODE, kills itself with SIGKILL, or prints `ready PID` and waits for a signal."""

import os
import signal
import sys
import time

from gossip_powersgd.faults import liveness, supervisor

if liveness.SUPERVISOR_VAR not in os.environ:
    supervisor.supervise()  # never returns
action = sys.argv[1]
if action == "exit":
    sys.exit(int(sys.argv[2]))
if action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
print(f"ready {os.getpid()}", flush=True)
time.sleep(60)
