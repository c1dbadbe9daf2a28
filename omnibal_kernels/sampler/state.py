"""Where a sampler is in its epoch, and the state that resumes it there.

A state (the same on every rank) records the epoch, the micro-steps handed out, and two fingerprints: of the
configuration (the loads, the groups, the options, the world size and micro-steps) and of the epoch's plan.
Loading it into a sampler with another configuration raises, and so does an epoch that plans differently now
(another engine, other inputs).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .._checks import check_epoch, check_int, check_positive_int
from ..balance.options import IsfOptions
from ..lengths import Lengths
from .groups import SamplerGroups

__all__ = ["STATE_VERSION", "Cursor", "config_fingerprint", "make_state", "read_state", "resume_position"]

STATE_VERSION = 1


def config_fingerprint(lengths: Lengths, groups: SamplerGroups, world_size: int, micro_steps: int) -> str:
    """A short hash of what a sampler plans from, besides the epoch."""
    h = hashlib.sha256()
    h.update(lengths.vit.tobytes())
    h.update(lengths.llm.tobytes())
    for g in groups.ids:
        h.update(np.int64(g.size).tobytes())
        h.update(g.tobytes())
    shared = groups.options[0]
    options: tuple[Any, ...] = (
        world_size,
        shared.method,
        groups.capacities,
        shared.seed,
        shared.drop_last,
        micro_steps,
        shared.oversize,
        shared.cost_model.terms(),
    )
    # ISF settings enter only where they are not the defaults: hashing them always would change the
    # fingerprint of every sampler, and no saved state would load.
    if any(opts.isf != IsfOptions() for opts in groups.options):
        options += (tuple(opts.isf for opts in groups.options),)
    h.update(repr(options).encode())
    return h.hexdigest()[:16]


@dataclass
class Cursor:
    """The position of a sampler in its epoch, in micro-steps.

    Attributes:
        epoch: the epoch sampled.
        start: where the next pass starts (a resumed position, else 0).
        pass_start: where the current (or last) pass started: what ``state_dict(consumed=...)`` counts from.
        position: micro-steps of the epoch handed out so far.
    """

    epoch: int = 0
    start: int = 0
    pass_start: int = 0
    position: int = 0

    def set_epoch(self, epoch: int) -> None:
        """Another epoch starts from its beginning; the current one keeps its (resumed) position."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.start = self.pass_start = self.position = 0

    def begin_pass(self) -> int:
        """A pass starts; returns the micro-step it starts at."""
        self.pass_start = self.position = self.start
        return self.start

    def end_pass(self) -> None:
        """A pass ran to the epoch's end: the next pass (without ``set_epoch``) replays the epoch."""
        self.start = 0

    def resume(self, epoch: int, position: int) -> None:
        self.epoch = epoch
        self.start = self.pass_start = self.position = position

    def saved_position(self, consumed: Optional[int], total: int) -> int:
        """The micro-step a state records: ``pass_start + consumed``, or all handed out without ``consumed``."""
        if consumed is None:
            return self.position
        consumed = check_positive_int("consumed", consumed, minimum=0)
        position = self.pass_start + consumed
        if position > total:
            raise ValueError(
                f"consumed={consumed} runs past the epoch's {total} micro-steps (pass started at {self.pass_start})"
            )
        return position


def make_state(
    cursor: Cursor,
    consumed: Optional[int],
    *,
    num_micro_steps: int,
    world_size: int,
    config_fingerprint: str,
    plan_fingerprint: str,
) -> dict[str, Any]:
    """The state dict of a sampler at ``cursor`` (see ``BalancedBatchSampler.state_dict``)."""
    return {
        "version": STATE_VERSION,
        "epoch": cursor.epoch,
        "micro_steps": int(cursor.saved_position(consumed, num_micro_steps)),
        "num_micro_steps": num_micro_steps,
        "world_size": world_size,
        "config_fingerprint": config_fingerprint,
        "plan_fingerprint": plan_fingerprint,
    }


def read_state(state: dict[str, Any], *, world_size: int, config_fingerprint: str, context_parallel: int = 1) -> int:
    """Checks what a state must agree on before its epoch is planned; returns the epoch. ``world_size`` is the
    sampler's count of data-parallel groups (its ranks over ``context_parallel``, the CP size)."""
    missing = {"epoch", "micro_steps", "config_fingerprint", "plan_fingerprint"} - set(state)
    if missing:
        raise ValueError(f"state_dict lacks {sorted(missing)}")
    if state.get("version", STATE_VERSION) > STATE_VERSION:
        raise ValueError(f"state_dict version {state['version']} is newer than this sampler's ({STATE_VERSION})")
    if state.get("world_size", world_size) != world_size:
        if context_parallel > 1:
            raise ValueError(
                f"state was saved with {state['world_size']} data-parallel groups, this sampler has {world_size} "
                f"({world_size * context_parallel} ranks in context-parallel groups of {context_parallel}): resume "
                "with as many data-parallel groups"
            )
        raise ValueError(f"state was saved with world_size {state['world_size']}, this sampler has {world_size}")
    if state["config_fingerprint"] != config_fingerprint:
        raise ValueError(
            "state was saved by a sampler with other lengths or options (config fingerprint "
            f"{state['config_fingerprint']} != {config_fingerprint})"
        )
    return check_epoch(state["epoch"])


def resume_position(state: dict[str, Any], *, epoch: int, plan_fingerprint: str, num_micro_steps: int) -> int:
    """The micro-step to resume at, once the state's epoch is planned and its plan matches."""
    if state["plan_fingerprint"] != plan_fingerprint:
        raise ValueError(
            f"epoch {epoch} plans differently now (plan fingerprint {state['plan_fingerprint']} "
            f"!= {plan_fingerprint}); the planning engine or its inputs changed"
        )
    position = check_int("micro_steps", state["micro_steps"])
    if not 0 <= position <= num_micro_steps:
        raise ValueError(f"micro_steps {position} is outside [0, {num_micro_steps}]")
    return position
