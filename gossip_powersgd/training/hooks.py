"""Extension points of the training loop: subclass `TrainingHooks`, pass `train(..., hooks=[...])`.

A privacy engine (clip and noise each peer's gradients), a message observer (wrap the algorithm or
watch the parameters after gossip) or an extra metric plugs in here without editing the loop. Each
method is a no-op by default; override only the points you need. Within one step the points run in
this order (D-PSGD, see `trainer`)::

    setup(context)                                 once, before the first step (and before resume)
    per step:
        before_backward(step, loss)                -> may return the loss to back-propagate
        after_backward(step)                       gradients exist; nothing has been averaged yet
        [gradient averagers: algorithm.step(); after_gossip(step)]
        optimizer.step(); after_optimizer_step(step)
        [parameter gossip:   algorithm.step(); after_gossip(step)]
        after_step(step, loss)                     the step's training loss on this peer
    on_evaluation(record)                          -> may return extra keys for the eval record
    on_record(record)                              each log / eval record, as written
    on_membership(step, members)                   on_peer_loss: continue: the members changed
    state_dict() / load_state_dict(state)          saved with every checkpoint, restored on resume
    on_checkpoint()                                after this peer's checkpoint is written whole
    close()                                        once at the end, also when the run fails
    on_summary(summary)                            after close, when the run ended normally

`step` is the 0-based index of the step in progress. Hooks run in list order, on every peer; a hook
may use the communicator (it is collective then, and must be called the same way on every peer).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch


@dataclasses.dataclass
class SetupContext:
    """What `TrainingHooks.setup` sees. A hook may replace `model`, `optimizer`, `batches` and
    `algorithm` (e.g. with wrappers); the loop uses whatever the last hook left.

    A replacement must behave like what it replaces: the model is called on a batch of inputs and
    returns logits; the optimizer has `param_groups` (the loop sets each group's "lr" every step),
    `zero_grad(set_to_none=...)`, `step()` and `state_dict()`/`load_state_dict()`; `batches` yields
    (inputs, targets) until its pass ends and has `state_dict()`/`load_state_dict()` (its position
    is checkpointed); the algorithm is a `GossipAlgorithm` over the model's parameters. The other
    fields are for reading only.
    """

    config: Any  #: the run's `TrainConfig`
    comm: Any  #: this peer's communicator
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Any  #: this peer's mini-batches (`data.Batches`)
    algorithm: Any  #: the gossip algorithm (`acts_on` says where it runs in the step)
    steps_per_epoch: int
    #: The total number of training samples of all peers, public: the shared dataset's size, or
    #: under `partition: local` the declared `public_train_size` (the all-reduced sum when
    #: `release_peer_statistics`). Never a peer's own shard size.
    train_size: Optional[int] = None
    #: Whether the run resumes from a checkpoint (loaded after every hook's `setup`): a hook whose
    #: set-up keeps state outside the checkpoint (DECOR's stored pair keys) checks it is all there.
    resuming: bool = False
    #: Where the run came from (`provenance.provenance`: commit, versions, command, hosts), the
    #: same on every peer; None when the caller of `build_run` gave none.
    provenance: Optional[Dict[str, Any]] = None
    #: How `build_run` builds the optimizer and the algorithm on a model's parameters (the pair);
    #: what `replace_model` calls.
    build: Optional[Callable[[torch.nn.Module], Tuple[Any, Any]]] = None

    def replace_model(self, model: torch.nn.Module) -> None:
        """Take `model`, whose parameters are new objects (a hook swapped layers, as DP's model
        check does), in place of `model` before any step: it is moved to the device, and the
        optimizer and the algorithm are built again on its parameters, as `build_run` built them
        (neither has stepped yet)."""
        self.model = model.to(self.device)
        self.optimizer, self.algorithm = self.build(self.model)


class TrainingHooks:
    """Base class of the training loop's extension points; every method is a no-op.

    `name` keys this hook's state in checkpoints: two hooks of one run need distinct names, and a
    run resumes only with hooks of the names its checkpoint holds.
    """

    name: str = ""
    #: True for a hook that only watches (it changes no bit of the run, e.g. the view recorder): a
    #: run may resume with it added (it starts fresh) or left out (its saved state is dropped).
    optional: bool = False

    @property
    def key(self) -> str:
        """The name this hook's checkpoint state is saved under (`name`, else the class name)."""
        return self.name or type(self).__name__

    def setup(self, context: SetupContext) -> None:
        """Once per run, after the model, optimizer, batches and algorithm are built and before a
        checkpoint is loaded into them (so wrappers see the resumed state). May replace
        `context.model`, `.optimizer`, `.batches`, `.algorithm` (see `SetupContext`)."""

    def before_backward(self, step: int, loss: torch.Tensor) -> Optional[torch.Tensor]:
        """After the forward pass. May return a tensor to back-propagate instead of `loss` (e.g. the
        loss plus a penalty); None keeps `loss`. The recorded training loss stays the
        cross-entropy."""
        return None

    def after_backward(self, step: int) -> None:
        """After `loss.backward()`, before gradients are averaged (gradient averagers) and before
        the optimizer step: the place to clip and noise gradients. May change `p.grad` in place."""

    def after_optimizer_step(self, step: int) -> None:
        """After `optimizer.step()`. May read or change the parameters in place."""

    def after_gossip(self, step: int) -> None:
        """After `algorithm.step()`: for parameter gossip the parameters are mixed (end of the
        step); for gradient averagers the gradients are averaged (the optimizer step follows)."""

    def after_step(self, step: int, loss: Optional[float]) -> None:
        """After the step is complete: `loss` is this peer's training loss of the step (None
        for an empty batch, which Poisson sampling under DP can draw). Under DP it is a function
        of this peer's data: keep it on this peer."""

    def on_record(self, record: Dict[str, Any]) -> None:
        """After a `log` or `eval` record is written to this peer's metrics file (a copy)."""

    def on_membership(self, step: int, members: Tuple[int, ...]) -> None:
        """Under on_peer_loss: continue only: the peers that are members from step `step` on
        (sorted ids), on every peer that sees the change (the departed one too, which learns that
        it left; a lost process sees nothing): at the start of that step, before any of its work
        and before the change itself (the state handed to joiners, the shift measured), so a
        record of step `step` or earlier is the old members'. Also once when such a run resumes
        (the membership in force at its checkpoint, before `load_state_dict`) and when a process
        of gossip-train --rejoin waits for its admission. Without it every peer is a
        member throughout and this is never called."""

    def close(self) -> None:
        """Once when the training loop ends, also when it fails: flush and close what was opened."""

    def on_summary(self, summary: Optional[Dict[str, Any]]) -> None:
        """Once after `close` when the run ended normally: the run's summary (what rank 0 wrote to
        summary.json, which exists by now), or None when making it failed."""

    def on_evaluation(self, record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """After an eval record is built, before it is written. May return extra keys (JSON
        values: it is written as JSON; anything else is refused) to add to it; a key the record
        already has is refused. `record` is a copy: changing it changes nothing."""
        return None

    def state_dict(self) -> Dict[str, Any]:
        """Extra state saved with every checkpoint: tensors and primitive containers only (the
        checkpoint is loaded with `weights_only=True`)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """On resume, after `setup`: what `state_dict` returned when the checkpoint was written."""

    def on_checkpoint(self) -> None:
        """After this peer's checkpoint file is written whole. `state_dict` is also taken for a
        leaving peer's away file (churn), which is no checkpoint: a hook that prunes files of its
        own to what the kept checkpoints need (DP's release digests) does it here."""


def _check_json_values(hook: str, extra: Dict[str, Any]) -> None:
    """Refuse an eval key whose value is not a JSON value: the record goes to the metrics file and
    every checkpoint's history as JSON, where such a value (a tensor, a numpy float32) failed at
    the first evaluation of a run with a run directory, naming neither the hook nor the key, and
    passed unnoticed in one without."""
    for key, value in extra.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"hook {hook!r} returned eval key {key!r} as a {type(value).__name__}, which "
                "is not a JSON value; return a number, string, bool, None or a list or dict of "
                "them (e.g. float(value) for a tensor or numpy scalar)"
            ) from None


#: Prefix of an optional hook's key in a checkpoint, so that a run resumed without it knows that
#: its state may be dropped.
OPTIONAL = "optional:"


class HookList:
    """Calls each hook's extension point in order (what the loop holds instead of a list)."""

    def __init__(self, hooks: Iterable[TrainingHooks] = ()):
        self.hooks: List[TrainingHooks] = list(hooks)
        for h in self.hooks:
            if not isinstance(h, TrainingHooks):
                raise ValueError(
                    f"hook {h!r} is a {type(h).__name__}; hooks must subclass "
                    "TrainingHooks (gossip_powersgd.training.hooks)"
                )
        keys = [h.key for h in self.hooks]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"two hooks are named {duplicates[0]!r}; give each a distinct `name` "
                "(it keys their checkpoint state)"
            )

    def setup(self, context: SetupContext) -> None:
        for h in self.hooks:
            h.setup(context)

    def before_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        for h in self.hooks:
            replaced = h.before_backward(step, loss)
            if replaced is not None:
                loss = replaced
        return loss

    def after_backward(self, step: int) -> None:
        for h in self.hooks:
            h.after_backward(step)

    def after_optimizer_step(self, step: int) -> None:
        for h in self.hooks:
            h.after_optimizer_step(step)

    def after_gossip(self, step: int) -> None:
        for h in self.hooks:
            h.after_gossip(step)

    def after_step(self, step: int, loss: Optional[float]) -> None:
        for h in self.hooks:
            h.after_step(step, loss)

    def on_record(self, record: Dict[str, Any]) -> None:
        for h in self.hooks:
            h.on_record(dict(record))

    def on_membership(self, step: int, members: Tuple[int, ...]) -> None:
        for h in self.hooks:
            h.on_membership(step, tuple(members))

    def close(self) -> None:
        """Close every hook, even when one of them fails (the first error is raised after)."""
        error = None
        for h in self.hooks:
            try:
                h.close()
            except Exception as exc:  # noqa: BLE001 - the others must still close
                error = error or exc
        if error is not None:
            raise error

    def on_summary(self, summary: Optional[Dict[str, Any]]) -> None:
        """Every hook's `on_summary`, even when one of them fails (the first error is raised)."""
        error = None
        for h in self.hooks:
            try:
                h.on_summary(summary)
            except Exception as exc:  # noqa: BLE001 - the others must still be told
                error = error or exc
        if error is not None:
            raise error

    def on_evaluation(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """`record` with every hook's extra keys added (a new dict)."""
        record = dict(record)
        for h in self.hooks:
            extra = h.on_evaluation(dict(record)) or {}
            clashes = sorted(set(extra) & set(record))
            if clashes:
                raise ValueError(
                    f"hook {h.key!r} returned eval key {clashes[0]!r}, which the "
                    "record already has; return new keys only"
                )
            _check_json_values(h.key, extra)
            record.update(extra)
        return record

    def state_dict(self) -> Dict[str, Dict[str, Any]]:
        """Each hook's state by key; an optional hook's key is prefixed `OPTIONAL` (see below)."""
        return {(OPTIONAL + h.key if h.optional else h.key): h.state_dict() for h in self.hooks}

    def on_checkpoint(self) -> None:
        for h in self.hooks:
            h.on_checkpoint()

    def load_state_dict(self, state: Dict[str, Dict[str, Any]]) -> None:
        """Restore each hook's saved state; the checkpoint must hold exactly this run's hooks,
        except optional ones (`TrainingHooks.optional`), which may have been added or left out."""
        saved_optional = {k[len(OPTIONAL) :] for k in state if k.startswith(OPTIONAL)}
        state = {(k[len(OPTIONAL) :] if k.startswith(OPTIONAL) else k): v for k, v in state.items()}
        optional = {h.key for h in self.hooks if h.optional}
        saved = sorted(set(state) - saved_optional - optional)
        current = sorted(h.key for h in self.hooks if not h.optional)
        if saved != current:
            raise ValueError(
                f"the checkpoint holds state for hooks {saved} but this run has "
                f"{current}; resume with the hooks the run was started with"
            )
        for h in self.hooks:
            if h.key in state:
                h.load_state_dict(state[h.key])


__all__ = ["HookList", "SetupContext", "TrainingHooks"]
