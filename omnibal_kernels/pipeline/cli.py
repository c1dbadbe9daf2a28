"""``omnibal-kernels partition`` and ``omnibal-kernels profile``: argument registration and run functions."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

__all__ = ["add_parsers"]

_GIB = 2**30


def add_parsers(sub: Any) -> None:
    """Registers ``partition`` and ``profile`` on an argparse sub-parser set."""
    from .._cli_args import fraction, int_in, non_negative_float, positive_float
    from .partition import OBJECTIVES, RECOMPUTE_MODES
    from .schedule import MAX_MICRO_BATCHES, SCHEDULES

    part = sub.add_parser(
        "partition",
        help="split a model into pipeline stages with per-stage recomputation; compare with the uniform split",
        description="Search the pipeline partition of a per-layer profile (a JSON file, or --config to estimate "
        "one) of least simulated step time under --schedule (or least bottleneck stage with --objective "
        "bottleneck), with a per-rank recompute plan under --memory-gb, and print it beside the uniform split.",
    )
    part.add_argument("profile", nargs="?", default=None, metavar="PROFILE", help="JSON profile file")
    part.add_argument(
        "--config",
        default=None,
        help="estimate the profile from a model config: internvl-300m-7b, internvl-6b-20b or an InternVL config.json",
    )
    part.add_argument("--stages", type=int, default=4, help="pipeline stages (default 4)")
    part.add_argument(
        "--micro-batches",
        type=int_in(1, MAX_MICRO_BATCHES),
        default=32,
        help="micro-batches per step (default 32, at most 10**9)",
    )
    part.add_argument(
        "--memory-gb",
        type=positive_float,
        default=None,
        help="memory per stage in GiB (default: memory is no constraint)",
    )
    part.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="1f1b",
        help="the torch.distributed.pipelining schedule the step is simulated under (default 1f1b)",
    )
    part.add_argument(
        "--virtual-stages",
        type=int,
        default=None,
        help="chunks per rank (default 1; 2 for zbv; interleaved and interleaved-zb take any)",
    )
    part.add_argument("--method", choices=("exact", "paper"), default="exact")
    part.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="step",
        help="exact search: least simulated step (default) or least bottleneck stage",
    )
    part.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        default="plan",
        help="plan: optimal per stage (default); uniform: none if it fits, else every layer",
    )
    part.add_argument("--link-gb-per-s", type=non_negative_float, default=25.0, help="GB/s between stages (default 25)")
    part.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="STAGE:LAYER",
        help="stage STAGE starts at layer LAYER (repeatable)",
    )
    part.add_argument(
        "--vit-on-first-stage", action="store_true", help="keep every 'vit' layer on stage 0 and nothing else there"
    )
    part.add_argument("--pack-tiles", type=non_negative_float, default=16.0, help="--config: ViT tiles per micro-batch")
    part.add_argument("--pack-tokens", type=positive_float, default=5376.0, help="--config: LLM tokens per micro-batch")
    part.add_argument("--pack-samples", type=int, default=4, help="--config: samples per micro-batch")
    part.add_argument(
        "--tflops", type=positive_float, default=312.0, help="--config: device peak TFLOP/s (default 312)"
    )
    part.add_argument("--efficiency", type=fraction, default=0.5, help="--config: fraction of peak (default 0.5)")
    part.add_argument(
        "--static-bytes-per-param",
        type=non_negative_float,
        default=16.0,
        help="--config: weights + gradients + optimizer bytes per parameter (default 16, mixed-"
        "precision Adam; 4 + 12 / DP with a distributed optimizer over DP ranks)",
    )
    part.add_argument("--json", action="store_true", help="print one JSON object")
    part.set_defaults(func=_run_partition)
    _add_profile_parser(sub)


def _add_profile_parser(sub: Any) -> None:
    from .._cli_args import non_negative_float, positive_float

    prof = sub.add_parser(
        "profile",
        help="measure a per-layer profile of a model on this machine (or estimate one from a config)",
        description="Measure forward/backward time, saved-activation bytes (saved_tensors_hooks), static and "
        "output bytes per layer of --model on its example batch, or estimate them from --config; write JSON.",
    )
    prof.add_argument(
        "--model",
        default=None,
        help="tiny-vlm, or MODULE:FUNCTION returning (layers, inputs) or (layers, inputs, kinds)",
    )
    prof.add_argument("--config", default=None, help="estimate from a model config instead (as for partition)")
    prof.add_argument("--pack-tiles", type=non_negative_float, default=16.0)
    prof.add_argument("--pack-tokens", type=positive_float, default=5376.0)
    prof.add_argument("--pack-samples", type=int, default=4)
    prof.add_argument("--static-bytes-per-param", type=non_negative_float, default=16.0)
    prof.add_argument("--repeats", type=int, default=3, help="timed runs per layer (median)")
    prof.add_argument("--threads", type=int, default=None, help="torch CPU threads while measuring")
    prof.add_argument("--out", default=None, help="write the profile to this JSON file")
    prof.add_argument("--json", action="store_true", help="print the profile as JSON")
    prof.set_defaults(func=_run_profile)


def _config_profile(args: argparse.Namespace) -> Any:
    import numpy as np

    from .estimate import profile_from_config

    n = args.pack_samples
    if n < 1 or args.pack_tiles < 0 or args.pack_tokens <= 0:
        raise ValueError("--pack-samples must be >= 1, --pack-tiles >= 0 and --pack-tokens > 0")
    pack = (np.full(n, args.pack_tiles / n), np.full(n, args.pack_tokens / n))
    return profile_from_config(
        args.config,
        [pack],
        tflops=getattr(args, "tflops", 312.0),
        efficiency=getattr(args, "efficiency", 0.5),
        static_bytes_per_param=args.static_bytes_per_param,
    )


def _fixed_starts(args: argparse.Namespace, profile: Any, stages: int) -> dict[int, int]:
    """The boundaries ``--fix`` and ``--vit-on-first-stage`` ask for, each checked against the ``stages``
    (virtual) stages and the profile's layers in the flag's own words."""
    fixed = {}
    for item in args.fix:
        stage, sep, layer = item.partition(":")
        if not sep or not stage.strip().isdigit() or not layer.strip().isdigit():
            raise ValueError(f"--fix expects STAGE:LAYER with two integers, got {item!r}")
        first = int(stage) == int(layer) == 0  # stage 0 starts at layer 0, the one place it can start
        if not first and not (0 < int(stage) < stages and 0 < int(layer) < len(profile)):
            raise ValueError(
                f"--fix {item}: STAGE must be in [1, {stages - 1}] ({stages} stages) and LAYER in "
                f"[1, {len(profile) - 1}] ({len(profile)} layers)"
            )
        fixed[int(stage)] = int(layer)
    if args.vit_on_first_stage:
        if stages < 2:
            raise ValueError(
                f"--vit-on-first-stage puts the ViT alone on stage 0 and the rest after it: it needs at least 2 "
                f"stages, got {stages}"
            )
        kinds = [layer.kind for layer in profile.layers]
        n_vit = 0
        while n_vit < len(kinds) and kinds[n_vit] == "vit":
            n_vit += 1
        if n_vit == 0 or "vit" in kinds[n_vit:]:
            raise ValueError("--vit-on-first-stage needs the profile's 'vit' layers first and contiguous")
        fixed[1] = n_vit
    return fixed


def _run_partition(args: argparse.Namespace) -> int:
    from .engines import deepspeed_parts, megatron_layout
    from .partition import partition
    from .profile import load_profile

    if (args.profile is None) == (args.config is None):
        raise ValueError("give one of PROFILE (a JSON profile) or --config")
    profile = load_profile(args.profile) if args.profile else _config_profile(args)
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise ValueError(f"--memory-gb must be > 0, got {args.memory_gb}")
    memory = None if args.memory_gb is None else args.memory_gb * _GIB
    chunks = args.virtual_stages if args.virtual_stages is not None else 2 if args.schedule == "zbv" else 1
    common = dict(
        micro_batches=args.micro_batches,
        memory_bytes=memory,
        schedule=args.schedule,
        virtual_stages=chunks,
        link_gb_per_s=args.link_gb_per_s,
    )
    best = partition(
        profile,
        args.stages,
        method=args.method,
        objective=args.objective,
        recompute=args.recompute,
        fixed_starts=_fixed_starts(args, profile, args.stages * chunks),
        **common,
    )
    uniform = partition(profile, args.stages, method="uniform", recompute="uniform", **common)
    out = best.to_dict()
    out["uniform"] = uniform.to_dict()
    out["speedup_vs_uniform"] = uniform.step_ms / best.step_ms
    out["layer_names"] = profile.names
    if chunks == 1:
        out["deepspeed_parts"] = deepspeed_parts(best)
    if any(layer.kind for layer in profile.layers):
        out["megatron"] = megatron_layout(best, profile)
    if memory is None:
        # Unbounded memory is a legal question ("what if memory were free?"), but not one to answer silently.
        print(
            f"omnibal-kernels: warning: no --memory-gb: memory is not a constraint; the plan's fullest rank "
            f"peaks at {max(best.peak_bytes) / _GIB:.1f} GiB (give --memory-gb to plan recomputation within "
            "each rank's memory)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(out))
        return 0
    names = profile.names
    print(
        f"{len(profile)} layers, {args.stages} ranks x {chunks} stages, {args.micro_batches} micro-batches, "
        f"{args.schedule}, memory {'unlimited' if memory is None else f'{args.memory_gb:g} GiB'} per rank"
    )
    for label, plan in ((f"{args.method} search ({args.objective})", best), ("uniform split", uniform)):
        proven = (
            ""
            if plan.method != "exact" or args.objective != "step"
            else (", optimal" if plan.optimality_gap <= 1e-9 else f", within {plan.optimality_gap:.2%} of optimal")
        )
        print(
            f"\n{label}: step {plan.step_ms:.1f} ms{proven}, bubble {plan.bubble:.3f}, bottleneck "
            f"{plan.bottleneck_ms:.1f} ms{'' if plan.fits else ', DOES NOT FIT'}"
        )
        print(
            f"  {'stage':>5} {'rank':>4}  {'layers':<28} {'n':>3}  {'recompute':>9}  {'ms/micro-batch':>14}  "
            f"{'rank peak GiB':>13}"
        )
        for s, (a, b) in enumerate(plan.stages):
            r = plan.stage_ranks[s]
            print(
                f"  {s:>5} {r:>4}  {names[a] + ' .. ' + names[b]:<28} {b - a + 1:>3}  {len(plan.recompute[s]):>9}  "
                f"{plan.stage_ms[s]:>14.1f}  {plan.peak_bytes[r] / _GIB:>13.2f}"
            )
    print(f"\npredicted speed-up over the uniform split: {uniform.step_ms / best.step_ms:.3f}x")
    return 0


# Named model factories for ``profile --model``: the tiny VLM lives with the test models, above this package.
_MODELS = {"tiny-vlm": "omnibal_kernels.testing.tiny_vlm:pipeline_example"}


def _load_factory(spec: str) -> Any:
    spec = _MODELS.get(spec, spec)
    module, sep, attr = spec.partition(":")
    if not sep:
        raise ValueError(f"--model expects tiny-vlm or MODULE:FUNCTION, got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--model {spec!r}: {exc}") from None
    built = factory()
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise ValueError(f"--model {spec!r}: the function must return (layers, inputs) or (layers, inputs, kinds)")
    return built if len(built) == 3 else (*built, None)


def _run_profile(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.config is None):
        raise ValueError("give one of --model or --config")
    if args.config:
        profile = _config_profile(args)
    else:
        import torch

        from .measure import measure_profile

        layers, inputs, kinds = _load_factory(args.model)
        if args.threads:
            torch.set_num_threads(args.threads)
        profile = measure_profile(layers, inputs, kinds=kinds, repeats=args.repeats)
    if args.out:
        profile.save(args.out)
    if args.json:
        print(json.dumps(profile.to_dict()))
        return 0
    print(f"{'layer':<16} {'kind':<10} {'fwd ms':>9} {'bwd ms':>9} {'act MiB':>9} {'static MiB':>10} {'out MiB':>8}")
    for layer in profile.layers:
        print(
            f"{layer.name:<16} {layer.kind:<10} {layer.forward_ms:>9.3f} {layer.backward_ms:>9.3f} "
            f"{layer.activation_bytes / 2**20:>9.2f} {layer.static_bytes / 2**20:>10.2f} "
            f"{layer.output_bytes / 2**20:>8.2f}"
        )
    if args.out:
        print(f"profile written to {args.out}", file=sys.stderr)
    return 0
