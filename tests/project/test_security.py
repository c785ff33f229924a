"""Security across the code base: nothing is ever unpickled (no pickle, torch.load only with
weights_only=True, no pickling MPI call), checked by scanning every module's source."""

import ast

from tests.conftest import ROOT

# mpi4py's lower-case methods pickle their payload; only upper-case buffer methods may be used.
PICKLING_MPI = {
    "send",
    "recv",
    "isend",
    "irecv",
    "ssend",
    "bsend",
    "sendrecv",
    "bcast",
    "gather",
    "allgather",
    "scatter",
    "alltoall",
    "reduce",
    "allreduce",
    "scan",
    "exscan",
    "ibcast",
    "igather",
    "iallgather",
    "mprobe",
    "improbe",
}


UNSAFE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "marshal",
    "shelve",
    "cloudpickle",
    "joblib",
}


def unsafe_calls(source: str, filename: str = "<string>"):
    """Every place in `source` that could unpickle: lower-case mpi4py calls, pickle imports,
    torch.load without weights_only=True, yaml loads other than safe_load, np.load(allow_pickle=True)."""
    problems = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            problems += [
                f"{where}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in UNSAFE_MODULES
            ]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES
        ):
            problems.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else None
            keywords = {k.arg: k.value for k in node.keywords}
            # torch.distributed's process groups (`group`, and the membership's group over one)
            # take tensors only: their send/recv pickle nothing
            owner_attr = owner.attr if isinstance(owner, ast.Attribute) else owner_name
            if attr in PICKLING_MPI and owner_attr != "group":
                problems.append(f"{where}: .{attr}() pickles (use the upper-case buffer method)")
            elif owner_name == "torch" and attr == "load":
                flag = keywords.get("weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    problems.append(f"{where}: torch.load without weights_only=True")
            elif owner_name == "yaml" and "load" in attr and attr != "safe_load":
                problems.append(f"{where}: yaml.{attr}")
            elif owner_name in ("np", "numpy") and attr == "load":
                flag = keywords.get("allow_pickle")
                if flag is not None and not (
                    isinstance(flag, ast.Constant) and flag.value is False
                ):
                    problems.append(f"{where}: np.load with allow_pickle")
    return problems


def test_the_unsafe_call_scanner_finds_each_kind():
    planted = (
        "import pickle\nfrom dill import loads\ncomm.send(x, dest=1)\ncomm.bcast(x)\n"
        "torch.load(p)\ntorch.load(p, weights_only=False)\nyaml.load(s)\nyaml.unsafe_load(s)\n"
        "np.load(p, allow_pickle=True)\n"
    )
    assert len(unsafe_calls(planted)) == 9
    fine = (
        "comm.Isend([b, MPI.BYTE], dest=1)\ncomm.allreduce_(t)\ncomm.allgather_bytes(b)\n"
        "torch.load(p, map_location='cpu', weights_only=True)\nyaml.safe_load(s)\nnp.load(p)\n"
        "self.group.send([t], 1, 0)\ngroup.recv([t], 1, 0)\n"  # a torch process group's tensors
    )
    assert unsafe_calls(fine) == []


def test_nothing_is_ever_unpickled():
    """No pickling MPI call, pickle import, unsafe torch.load or yaml load in the package, the
    topology library or the experiments. (Receive sizes and dtypes are checked from the probe before
    the buffer is touched: tests/comm/test_local.py,
    test_mpi_wrong_message_size_ends_the_job_naming_the_peer.)"""
    files = [
        p
        for folder in ("gossip_powersgd", "topologies", "experiments")
        for p in sorted((ROOT / folder).rglob("*.py"))
    ]
    assert len(files) > 20
    problems = [p for f in files for p in unsafe_calls(f.read_text(), str(f.relative_to(ROOT)))]
    assert problems == []
    mpi_source = (ROOT / "gossip_powersgd" / "comm" / "mpi.py").read_text()
    receive = mpi_source[mpi_source.index("def _receive") :]
    assert receive.index("self._check_message(") < receive.index(".Recv(")
