"""A config-driven feature in one file (what `tests/training/test_features.py` registers with one line).

Key `count_steps_every` (nested: ``step_counter: {every: k}``; 0 = off) makes every peer count the
steps whose index is a multiple of k; the summary gains the count and a table row, the progress
line the count so far.
"""

from __future__ import annotations

from gossip_powersgd.training.features import Feature, Key, register
from gossip_powersgd.training.hooks import TrainingHooks


class StepCounter(TrainingHooks):
    name = "step_counter"

    def __init__(self, every: int):
        self.every, self.counted = every, 0

    def after_step(self, step, loss):
        self.counted += step % self.every == 0

    def on_evaluation(self, record):
        return {"counted_steps": self.counted}

    def summary_fields(self):
        return {"counted_steps": self.counted, "count_every": self.every}

    def state_dict(self):
        return {"counted": self.counted}

    def load_state_dict(self, state):
        self.counted = state["counted"]


def _validate(config):
    if config.count_steps_every < 0:
        raise ValueError(
            f"bad value for 'count_steps_every': {config.count_steps_every!r} (must "
            "be >= 0 steps; 0 = off)"
        )


register(
    Feature(
        name="step_counter",
        section="step_counter",
        keys=[
            Key(
                "count_steps_every",
                "int",
                0,
                nested="every",
                doc="Example feature: count every k-th step (0 = off).",
            )
        ],
        validate=_validate,
        hooks=lambda c: [StepCounter(c.count_steps_every)] if c.count_steps_every else [],
        summary_rows=lambda s: (
            [(f"steps counted (every {s['count_every']})", str(s["counted_steps"]))]
            if "counted_steps" in s
            else []
        ),
        eval_text=lambda r: f"  counted {r['counted_steps']}" if "counted_steps" in r else "",
    )
)
