"""Hosts on one machine: an emulated cluster to run multi-host launches on (as root).

    python -m gossip_powersgd.cluster up --hosts 4 --rate 100mbit   # host0 ... host3
    python -m gossip_powersgd.cluster exec host1 -- COMMAND ...      # run on host1
    python -m gossip_powersgd.cluster down

Each host is a network namespace with its own address on one switch (a bridge in a namespace of
its own), its link rate-limited by tc's tbf, its name resolvable on every host and its own hostname;
`gossip-cluster-ssh` stands in for ssh (Hydra's `-launcher ssh -launcher-exec`). network.py builds
and removes it, enter.py runs commands on its hosts, launch.py one program on every host (and
waits for all of them), measure.py a link's rate, soak.py faults of single hosts under a
training run (kills, stops, link cuts, timed to the survivors' membership lines), __main__.py is the
command line.
"""

from .enter import current_prefix, enter_command, resolve_prefix, ssh_main
from .network import ClusterError, down, missing_requirements, parse_rate, set_rate, up

__all__ = [
    "ClusterError",
    "current_prefix",
    "down",
    "enter_command",
    "missing_requirements",
    "parse_rate",
    "resolve_prefix",
    "set_rate",
    "ssh_main",
    "up",
]
