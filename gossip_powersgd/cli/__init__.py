"""The command-line programs, installed as console scripts.

    gossip-train   (gossip_powersgd.cli.train)   train from a YAML config, locally or under mpiexec
    gossip-plot    (gossip_powersgd.cli.plot)    accuracy and consensus figures of run directories

Nothing is imported here, so `python -m gossip_powersgd.cli.<program>` loads only what it needs.
"""
