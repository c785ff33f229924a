"""Train with decentralized gossip from a YAML config (the `gossip-train` program).

    gossip-train --config tiny                           # a bundled example (seconds)
    gossip-train --config experiments/configs/tiny.yaml  # the same file, from a checkout
    mpiexec -n 8 gossip-train --config demo --set lr=0.05
    gossip-train --resume runs/demo                      # continue from the last checkpoint
    gossip-train --config C.yaml --resume auto           # continue if checkpointed, else start
    gossip-train --help-config                           # every config key, documented
    python -m gossip_powersgd.cli.train ...              # the same program, without the script

`backend: mpi` runs one peer per MPI rank and must be launched with mpiexec (as many ranks as the
topology has peers); `backend: local` runs every peer as a thread of this one process. The run
directory (`out_dir`, default runs/<config name>) receives config.yaml (the fully resolved config),
metrics/rank-K.jsonl, checkpoints/, summary.json and summary.md; an existing one is never
overwritten, only continued with --resume. Any error is one line on every rank and a non-zero exit.

The example configs ship with the package (gossip_powersgd/examples/*.yaml, in a checkout a link
to experiments/configs): `--config NAME` runs the bundled NAME.yaml when no file
NAME exists, so a pip-installed package runs them without a checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from gossip_powersgd.cli import program_name
from gossip_powersgd.launch import (
    intra_op_threads,
    launched_by_mpiexec,
    launched_rank,
    main_guard,
    resolve_backend,
    run_peers,
    transport,
)

#: The module `python -m` runs this program as; a checkout's `experiments.train` passes its own, so
#: that its help and its mpiexec hint name the command the user typed.
MODULE = "gossip_powersgd.cli.train"
#: The bundled example configs (package data).
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_configs() -> Dict[str, Path]:
    """{name: path} of the bundled example configs (`--config NAME`)."""
    return {p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))}


def config_path(text: str) -> Path:
    """The config file `--config TEXT` names: the file TEXT if it exists, else the bundled example
    TEXT (with or without .yaml); neither is a one-line error listing the examples."""
    path = Path(text)
    if path.exists():
        return path
    examples = example_configs()
    name = text[:-5] if text.endswith(".yaml") else text
    if "/" not in text and name in examples:
        return examples[name]
    raise ValueError(
        f"config file {text} not found (the bundled examples, usable as --config NAME: "
        f"{', '.join(examples) or 'none installed'})"
    )


def build_parser(module: str = MODULE) -> argparse.ArgumentParser:
    """The command line of `gossip-train`, its usage line spelled as `python -m <module>`."""
    parser = argparse.ArgumentParser(
        prog=program_name(module, "gossip-train"),
        description="Decentralized training with gossip (PowerGossip and baselines).",
    )
    parser.add_argument(
        "--config",
        metavar="FILE|NAME",
        help="YAML config file (see --help-config for the keys), or the name of a "
        f"bundled example: {', '.join(example_configs())}",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key; VALUE is parsed as YAML, except that a "
        "string key takes the text as typed (repeatable)",
    )
    parser.add_argument(
        "--resume",
        nargs="+",
        metavar="RUN_DIR",
        help="RUN_DIR: continue the run in RUN_DIR from its newest checkpoint "
        "(its config.yaml is used unless --config is given); auto "
        "[RUN_DIR]: continue the run (RUN_DIR, else the config's out_dir) "
        "if it has a checkpoint, else start it, so that a relaunch of the "
        "same command (torchrun --max-restarts, a requeued batch job) "
        "carries on",
    )
    parser.add_argument(
        "--rejoin",
        type=int,
        metavar="ID",
        help="take part again as peer ID in a running run (backend torch, on_peer_loss: "
        "continue) that removed it: started like its other processes (MASTER_ADDR/PORT, "
        "WORLD_SIZE; RANK unset or ID), admitted by the members, handed their state",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-epoch lines")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    return parser


def _mpi_world() -> tuple:
    """(rank, size) when launched by mpiexec (initialising MPI), else (0, 1)."""
    if not launched_by_mpiexec():
        return 0, 1
    try:
        import mpi4py  # noqa: F401 - its absence is the error below
    except ImportError as exc:
        raise ImportError(
            "launched by mpiexec but mpi4py is missing: pip install 'gossip_powersgd[mpi]'"
        ) from exc
    from gossip_powersgd.comm.mpi import _mpi, tell_world_at_exit

    MPI = _mpi()  # initialised with the GIL released, so the liveness monitor runs meanwhile

    tell_world_at_exit()  # a rank that exits before its communicator exists still tells the others
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def start_line(processes: int) -> str:
    """Rank 0's first line, printed as the program starts (one per run, whatever the launcher)."""
    return (
        f"start: {processes} process{'es' if processes > 1 else ''}, loading the libraries and "
        "the config"
    )


def _check_extras(args: argparse.Namespace) -> None:
    """Refuse, in one line, a config that needs an optional extra that is not installed
    (`extras.missing_extra`), from the config file's text and --set alone. A file that cannot be
    read here is left for `resolve`, which names the problem."""
    from gossip_powersgd.extras import missing_extra
    from gossip_powersgd.training.yaml_loader import strict_yaml_load

    mode, target = resume_request(args)
    try:
        path = config_path(args.config) if args.config else Path(target) / "config.yaml"
        data = strict_yaml_load(path.read_text(), str(path))
    except (ValueError, OSError, TypeError):
        return
    missing = missing_extra(data if isinstance(data, dict) else {}, args.overrides)
    if missing:
        raise ImportError(missing)


def resume_request(args: argparse.Namespace) -> Tuple[Optional[str], Optional[str]]:
    """What --resume asks for: (None, None) nothing; ("dir", RUN_DIR); ("auto", RUN_DIR or None)."""
    from gossip_powersgd.training.rundir import AUTO

    values = args.resume or []
    if not values:
        return None, None
    if values[0] == AUTO and len(values) <= 2:
        return AUTO, values[1] if len(values) == 2 else None
    if len(values) == 1:
        return "dir", values[0]
    raise ValueError(
        f"--resume takes RUN_DIR or auto [RUN_DIR], got {' '.join(values)!r} (a run "
        "directory named auto: --resume ./auto)"
    )


def resolve(args: argparse.Namespace, world_size: int):
    """The validated config of this invocation, with out_dir and peers filled in."""
    from gossip_powersgd.training.config import load_config

    mode, target = resume_request(args)
    if args.config is None and target is None:
        raise ValueError(
            "give --config FILE (or --resume RUN_DIR to continue a run)"
            if mode is None
            else "--resume auto needs --config FILE or a RUN_DIR holding config.yaml"
        )
    overrides = list(args.overrides)
    if args.quiet:
        overrides.append("quiet=true")
    if args.config is None:
        path = Path(target) / "config.yaml"
        if not path.is_file():
            raise ValueError(
                f"cannot resume {target}: it has no config.yaml (is it a run "
                "directory? to start it, give --config FILE)"
            )
    else:
        path = config_path(args.config)
    config = load_config(path, overrides)
    if target is not None:
        _refuse_another_out_dir(target, overrides)
        config = config.replace(out_dir=str(target))  # the run being continued is authoritative
    if config.out_dir is None:
        config = config.replace(out_dir=str(Path("runs") / path.stem))
    return config


def _refuse_another_out_dir(resume: str, overrides: List[str]) -> None:
    """--resume D continues the run in D: a --set out_dir naming another directory would be
    ignored, so it is refused rather than leaving the user to look for the run in the wrong place."""
    from gossip_powersgd.training.config import parse_override

    for text in overrides:
        key, value = parse_override(text)
        same = isinstance(value, str) and Path(value).resolve() == Path(resume).resolve()
        if key == "out_dir" and not same:
            raise ValueError(
                f"--resume {resume} continues the run in {resume}, so --set "
                f"out_dir={value} would be ignored: drop --set out_dir (or copy the run "
                f"directory there and --resume that copy)"
            )


def _import_from_cwd() -> None:
    """Put the current directory first on sys.path, as ``python -m`` does, so that a
    bring-your-own ``mydata:load`` module next to the config imports without PYTHONPATH."""
    import os

    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def run(argv: Optional[List[str]] = None, *, module: str = MODULE) -> Optional[Dict[str, Any]]:
    """Parse `argv`, train, print the summary on rank 0; returns this process's summary.

    Raises on errors (`main` turns them into one line and a non-zero exit). `module` is the name
    the help and the error hints give the program (`python -m <module>`).
    """
    args = build_parser(module).parse_args(argv)
    _import_from_cwd()
    if args.help_config:
        from gossip_powersgd.training.keydocs import describe_keys

        from gossip_powersgd.cli.help import describe_registries

        print(describe_keys())
        print("\naccepted values (registered):\n\n" + describe_registries())
        return None
    if args.rejoin is not None:  # the peer id is the rank (checked in `check_rejoin`)
        os.environ.setdefault("RANK", str(args.rejoin))
        if os.environ.get("WORLD_SIZE", "").isdigit():  # before the launcher's check of RANK
            check_rejoin_id(args.rejoin, int(os.environ["WORLD_SIZE"]))
    # The first sign of life, from the launcher's environment: before MPI and torch are loaded.
    launched = launched_rank() or (None if launched_by_mpiexec() else (0, 1))
    started = time.perf_counter()
    if launched is not None and launched[0] == 0 and not args.quiet:
        print(start_line(launched[1]), flush=True)
    _check_extras(args)  # a missing optional package, from the config's text: before torch
    rank, world_size = _mpi_world()
    if launched is None and rank == 0 and not args.quiet:  # a launcher that only MPI can tell
        print(start_line(world_size), flush=True)
    first = (launched or (rank, world_size))[0] == 0  # rank 0 of any launcher (torchrun's too)
    config = resolve(args, world_size)

    import torch

    from gossip_powersgd.training.trainer import format_summary, train

    torch.set_num_threads(intra_op_threads(config.threads))
    if first and not config.quiet:
        print(
            f"set-up: libraries and config loaded ({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    resume = {None: False, "dir": True, "auto": "auto"}[resume_request(args)[0]]
    topology = _topology(config, module)
    device = "cpu"
    if transport(config.backend).uses_device:
        from gossip_powersgd.training.setup import resolve_device

        device = resolve_device(config.device, 0).type  # the GPU index comes from LOCAL_RANK
    config = config.replace(peers=topology.size)
    if args.rejoin is not None:
        from gossip_powersgd.comm.torch_rejoin import rejoin_as

        check_rejoin(args.rejoin, config, topology.size, bool(resume))
        rejoin_as(args.rejoin)
    results = run_peers(
        topology,
        train,
        config,
        resume=resume,
        backend=config.backend,
        timeout=config.comm_timeout,
        device=device,
    )
    # rank 0's under local (the lowest member's if peers left), this process's when launched
    members = sorted(r for r, s in results.items() if not s.get("departed")) or sorted(results)
    summary = results[members[0]]
    leader = min(summary.get("members_at_end") or [0])  # the lowest live id after churn
    if summary["rank"] == leader or transport(config.backend).in_process:
        print(format_summary(summary))
        print(f"run directory: {config.out_dir}", flush=True)
    return summary


def check_rejoin_id(peer: int, size: int) -> None:
    """--rejoin ID of a run of `size` peers: 1..size-1 (a one-line ValueError otherwise)."""
    if not 0 < peer < size:
        where = "peer 0 hosts the rendezvous store, which the run cannot lose" if peer == 0 else ""
        raise ValueError(
            f"--rejoin {peer}: out of range (peers 1..{size - 1} can rejoin{'; ' if where else ''}{where})"
        )


def check_rejoin(peer: int, config, size: int, resume: bool) -> None:
    """--rejoin ID: a one-line ValueError for what cannot rejoin (on every process: each one runs
    this before it connects)."""
    from gossip_powersgd.privacy import dp_enabled

    if config.on_peer_loss != "continue" or resolve_backend(config.backend) != "torch":
        raise ValueError(
            "--rejoin needs a run with on_peer_loss: continue on backend torch (other runs end "
            "when a peer is lost, or run in one process): set both, or restart the whole run"
        )
    if resume:
        raise ValueError(
            "--rejoin and --resume exclude each other: a rejoining peer is handed its state"
        )
    check_rejoin_id(peer, size)
    if os.environ.get("RANK", str(peer)) != str(peer):
        raise ValueError(
            f"--rejoin {peer} but RANK={os.environ['RANK']}: the peer id is stable; start the "
            f"process with RANK={peer} or without RANK (not by an elastic restart, which renumbers)"
        )
    if dp_enabled(config.dp_noise_multiplier, config.dp_target_epsilon):
        raise ValueError(
            "--rejoin with DP-SGD is not supported in this version (a rejoining peer's accountant "
            "must come from its own last state): restart the whole run with --resume"
        )


def _topology(config, module: str):
    """The config's topology, after checking that this process was started as its backend needs
    (`launch.resolve_backend`: the launcher checks every entry point shares) and, for a launched
    backend, that the launcher started as many processes as the topology has peers."""
    from gossip_powersgd.training.config import resolve_topology

    try:
        n = resolve_topology(config).size
    except ValueError:
        n = "N"
    resolve_backend(config.backend, cli=module, n=n)
    entry = transport(config.backend)
    if entry.in_process:
        return resolve_topology(config)
    world_size = entry.world_size()
    launcher = entry.launcher_name()
    if config.peers is not None and config.peers != world_size:
        raise ValueError(
            f"peers is {config.peers} but {launcher} started {world_size} processes: "
            f"start {config.peers}"
        )
    topology = resolve_topology(config, world_size=world_size)
    if topology.size != world_size:
        raise ValueError(
            f"topology {config.topology!r} has {topology.size} peers but {launcher} "
            f"started {world_size} processes: start {topology.size}"
        )
    return topology


def main(argv: Optional[List[str]] = None, *, module: str = MODULE) -> None:
    """Console-script entry point (`gossip-train`): one-line errors, exit status."""
    main_guard(lambda: (run(argv, module=module), 0)[1])


if __name__ == "__main__":
    main()
