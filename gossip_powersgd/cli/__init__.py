"""The command-line programs, installed as console scripts.

    gossip-train   (gossip_powersgd.cli.train)   train from a YAML config, locally or under mpiexec
    gossip-plot    (gossip_powersgd.cli.plot)    accuracy and consensus figures of run directories

Nothing is imported here, so `python -m gossip_powersgd.cli.<program>` loads only what it needs.
"""


def program_name(module: str, script: str) -> str:
    """How a program's usage line names it: its console script (`script`) when that is what
    ran, else ``python -m <module>`` (a checkout's `experiments.train` passes its own module)."""
    import sys
    from pathlib import Path

    return script if sys.argv and Path(sys.argv[0]).name == script else f"python -m {module}"
