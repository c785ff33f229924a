"""Record-level differential privacy on each peer: DP-SGD with Opacus and honest accounting.

Every peer samples its own shard by Poisson sampling (``PoissonBatches``), clips each example's
gradient and adds its own Gaussian noise before its optimizer step (``DPSGD``), and keeps its own
accountant (``accounting``): peers with different shard sizes have different sampling rates and
therefore different epsilons, all of which are reported.

Opacus is imported only when one of these is used; without it they raise a one-line ImportError
with the install command.
"""

from gossip_powersgd.privacy.accounting import (
    ACCOUNTANT_NAMES,
    default_delta,
    epsilon,
    make_accountant,
    noise_for_target,
)
from gossip_powersgd.privacy.dependency import MISSING_OPACUS, import_opacus
from gossip_powersgd.privacy.dpsgd import DPSGD, dp_enabled, validate_dp_options, validate_model
from gossip_powersgd.privacy.sampling import PoissonBatches, poisson_rate

__all__ = [
    "ACCOUNTANT_NAMES",
    "DPSGD",
    "MISSING_OPACUS",
    "PoissonBatches",
    "default_delta",
    "dp_enabled",
    "epsilon",
    "import_opacus",
    "make_accountant",
    "noise_for_target",
    "poisson_rate",
    "validate_dp_options",
    "validate_model",
]
