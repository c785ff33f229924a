"""Record-level differential privacy on each peer: DP-SGD with Opacus and honest accounting.

Every peer samples its own shard by Poisson sampling (``PoissonBatches``), clips each example's
gradient and adds its own Gaussian noise before its optimizer step (``DPSGD``), both drawn from a
keystream keyed by a secret of that peer (``Randomness``), and keeps its own accountant
(``accounting``, with dp-accounting's PLD beside it: ``pld_epsilon``): peers with different shard
sizes have different sampling rates and therefore different epsilons, each in its own file.

Opacus is imported only when one of these is used; without it they raise a one-line ImportError
with the install command.

Auditing a claimed epsilon in one run: `audit` (Steinke, Nasr, Jagielski, NeurIPS 2023) turns an
observer's guesses about canaries (`canaries.Canaries` inserts them into a victim's shard, each
with probability 1/2) into an epsilon lower bound at a stated confidence.

What an honest-but-curious neighbour learns: `views` records what each observer receives
(`ObserverHooks`, the ``observers`` config key), `reconstruction` estimates a neighbour's model
from a view, `membership` runs the LOSS membership-inference attack, and `network_dp` computes the
exact pairwise network DP of noisy exact gossip (each observer's whole view as one Gaussian
mechanism), and `knowledge` the knowledge-matrix attack (El Mrini, Cyffers, Bellet, ICML 2024):
which peers, neighbours or not, the messages of one or several colluders determine
(`knowledge_attack`: the attack on a recorded run's views, scored against the truth).
"""

from gossip_powersgd.privacy.accounting import (
    ACCOUNTANT_NAMES,
    default_delta,
    epsilon,
    make_accountant,
    noise_for_target,
    pld_epsilon,
)
from gossip_powersgd.privacy.audit import AuditResult, audit, best_audit, epsilon_lower_bound
from gossip_powersgd.privacy.canaries import Canaries
from gossip_powersgd.privacy.dependency import MISSING_OPACUS, import_opacus
from gossip_powersgd.privacy.knowledge import (
    colluders_for_all,
    colluders_needed,
    knowledge_matrix,
    reach,
)
from gossip_powersgd.privacy.knowledge_attack import attack_run, colluder_attack
from gossip_powersgd.privacy.dpsgd import DPSGD, dp_enabled, validate_dp_options, validate_model
from gossip_powersgd.privacy.membership import (
    DEFAULT_FPR,
    auc,
    loss_attack,
    loss_scores,
    membership_inference,
    membership_samples,
    model_with_parameters,
    null_auc_std,
    tpr_at_fpr,
)
from gossip_powersgd.privacy.gaussian import dp_epsilon, gaussian_epsilon
from gossip_powersgd.privacy.network_dp import (
    local_epsilon,
    mixing_matrix,
    pairwise_epsilon,
    pairwise_leakage,
    pairwise_privacy_loss,
    pairwise_rdp,
    per_message_composition_rdp,
    view_matrix,
)
from gossip_powersgd.privacy.reconstruction import (
    DEFAULT_WINDOW,
    reconstruct,
    reconstruction_errors,
    relative_error,
    trivial_estimates,
)
from gossip_powersgd.privacy.sampling import PoissonBatches, poisson_rate
from gossip_powersgd.privacy.seeds import Randomness
from gossip_powersgd.privacy.observing import ObserverHooks, observer_hook
from gossip_powersgd.privacy.views import (
    ObservedView,
    RecordingCommunicator,
    ViewRecorder,
    load_view,
    observed_dir,
)

__all__ = [
    "ACCOUNTANT_NAMES",
    "AuditResult",
    "Canaries",
    "attack_run",
    "audit",
    "best_audit",
    "colluder_attack",
    "colluders_for_all",
    "colluders_needed",
    "knowledge_matrix",
    "reach",
    "epsilon_lower_bound",
    "DEFAULT_FPR",
    "DEFAULT_WINDOW",
    "DPSGD",
    "MISSING_OPACUS",
    "ObservedView",
    "ObserverHooks",
    "PoissonBatches",
    "Randomness",
    "RecordingCommunicator",
    "ViewRecorder",
    "auc",
    "default_delta",
    "dp_enabled",
    "dp_epsilon",
    "epsilon",
    "gaussian_epsilon",
    "import_opacus",
    "load_view",
    "local_epsilon",
    "loss_attack",
    "loss_scores",
    "make_accountant",
    "membership_inference",
    "membership_samples",
    "mixing_matrix",
    "model_with_parameters",
    "noise_for_target",
    "null_auc_std",
    "observed_dir",
    "observer_hook",
    "pairwise_epsilon",
    "pairwise_leakage",
    "pairwise_privacy_loss",
    "pairwise_rdp",
    "per_message_composition_rdp",
    "pld_epsilon",
    "poisson_rate",
    "reconstruct",
    "reconstruction_errors",
    "relative_error",
    "tpr_at_fpr",
    "trivial_estimates",
    "validate_dp_options",
    "validate_model",
    "view_matrix",
]
