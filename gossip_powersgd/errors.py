"""The package's own exceptions, in one module of the standard library only, so that the launch
path (`launch.main_guard`, the training CLI) can name them before torch is imported.

Each is re-exported where it is raised (`comm.base`, `algorithms.base`) and from the package.
"""

from __future__ import annotations


class CommunicationError(RuntimeError):
    """A message could not be delivered or was not what the receiver expected."""


class PeerAborted(CommunicationError):
    """Another peer failed, so this one stops instead of waiting forever."""


class PeerLostError(CommunicationError):
    """A wait ended because a peer was found lost under ``on_peer_loss: continue``: the survivors
    agree on a membership without it (`membership.detected`); this operation is abandoned."""


class AgreementError(ValueError):
    """Peers disagree on something they must share (topology, parameter shapes, configuration).

    Raised identically on every rank, so that every rank can exit with the same message.
    """


class NonFiniteError(FloatingPointError):
    """A peer was about to send a NaN or an infinity to its neighbours."""


__all__ = [
    "CommunicationError",
    "PeerAborted",
    "PeerLostError",
    "AgreementError",
    "NonFiniteError",
]
