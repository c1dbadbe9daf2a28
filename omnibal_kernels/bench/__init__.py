"""The benchmark suite: every number side by side, from one command.

    omnibal-kernels bench [--quick] [--json out.json] [--markdown out.md] [--plot DIR]
    python -m pytest benchmarks/ --benchmark-only          # the same providers as pytest-benchmark groups

Providers, registered by name in :mod:`.runner` and run in this order:

* ``quality`` (:mod:`.quality`): balance quality and simulated training time, methods x data x world sizes;
* ``cp`` (:mod:`.context_parallel`): context-parallel layouts of long-context packs: per-rank balance, K/V
  exchanged, padding and predicted step time of every strategy at CP 2, 4, 8;
* ``planning`` (:mod:`.planning`): planning time against ``numpy.argsort`` as N grows, sampler cost at scale;
* ``collate`` (:mod:`.collate`): ``pack_batch`` against a per-sample Python collator and the ``torch.cat``
  floor, in the main process and in DataLoader workers;
* ``ddp`` (:mod:`.ddp`): a tiny VLM trained with DDP over 2 CPU processes, random padded vs balanced packs;
* ``gpu`` (:mod:`.gpu`): the Triton kernel benchmarks of ``benchmarks/``, only where CUDA is present.

The baselines the planner is measured against live in :mod:`.baselines`; they are yardsticks, not library
features.
"""

from .runner import PROVIDER_NAMES, Config, environment, register, run_suite

__all__ = ["PROVIDER_NAMES", "Config", "environment", "register", "run_suite"]
