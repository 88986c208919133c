"""``drapps simulate``, ``drapps evaluate-policy`` and ``drapps train-policy``."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

from drapps.cli._args import Commands, UsageError, check_positive, name_list, reward_weights
from drapps.control.policy import Policy, policy_names
from drapps.control.reward import RewardWeights
from drapps.sim.scenario import Scenario

if TYPE_CHECKING:
    from drapps.control.rl import MlpPolicy
    from drapps.sim.run import SimRun

CALIBRATED_EPISODES = 80
"""Episodes of the traced runs ``train-policy --calibrate`` labels by default."""
ANCHORS_PER_EPISODE = 4
"""Episodes of the training families, per traced-run episode, whose States hold the policy
where it was (unbranched, they cost a fortieth of a labelled episode each)."""

FIT_PASSES = 500
"""Passes over the labelled States ``train-policy --calibrate`` fits at most (20,000 steps
of 256 at most: about 9,000 States)."""

ONE_PER_CORE = -1
"""The worker count of ``--policy static``: one per core of the scenario's machine."""

POLICY_HELP = (
    "heuristic (default), rl (the shipped learned policy), static (one worker per core), "
    "static-N, dataloader (num_workers=0), oracle-static, or a policy .npz file"
)


REWARD_HELP = (
    "reward weights other than the defaults, like start=0.2 (charge each worker added) or "
    "energy=1 (samples per joule); names: " + ", ".join(f.name for f in fields(RewardWeights))
)


def resolve_policy(spec: str) -> tuple[Policy | str, int | str]:
    """(policy, workers) for a --policy value; ``oracle-static`` is handled by the caller.

    Raises:
        ValueError: an unknown name (listing the valid ones) or an unreadable file.
    """
    if spec.endswith(".npz"):
        from drapps.control.rl import MlpPolicy

        return MlpPolicy.load(spec), "auto"
    if spec == "dataloader":
        return "static", 0
    if spec.startswith("static-"):
        count = spec.removeprefix("static-")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"static-N needs a worker count N >= 1, got {spec!r}")
        return "static", int(count)
    if spec == "static":
        return "static", ONE_PER_CORE
    if spec not in policy_names():
        valid = [*policy_names(), "static-N", "dataloader", "oracle-static", "<file>.npz"]
        raise ValueError(f"policy must be one of {valid}, got {spec!r}")
    return spec, "auto"


def _scenario(args: argparse.Namespace) -> tuple[Scenario, str]:
    """The scenario to run and a line saying where it came from."""
    import numpy as np

    from drapps.sim import calibration as cal
    from drapps.sim.families import draw, family_names

    source = args.scenario
    if Path(source).suffix == ".jsonl" or Path(source).is_file():
        if not Path(source).is_file():
            raise ValueError(f"--scenario {source!r}: no such trace file")
        trace = cal.load(source)  # read once: calibrate and record both use it
        pipeline = cal.calibrate(trace)
        recorded = cal.record(trace)
        check = cal.replay(pipeline, recorded, seed=args.seed)
        line = (
            f"calibrated from {source}: replaying it gives {check.run.throughput:.0f} samples/s "
            f"vs {recorded.throughput:.0f} measured ({check.throughput_error:.1%} off), "
            f"waited {check.run.wait_fraction:.0%} vs {recorded.wait_fraction:.0%}"
        )
        return Scenario(pipeline, recorded.outside, "trace"), line
    if source not in family_names():
        raise ValueError(
            f"--scenario must be a trace .jsonl or one of {family_names()}, got {source!r}"
        )
    rng = np.random.default_rng(args.seed)
    return draw(source, rng, args.duration), f"drawn from family {source!r} (seed {args.seed})"


def _describe(scenario: Scenario) -> str:
    p = scenario.pipeline
    parts = [
        f"{p.cores} cores",
        f"batch {p.batch_size}",
        f"worker CPU {1000 * p.cpu_s:.1f} ms/batch",
        f"read wait {1000 * p.read_s:.1f} ms/batch",
        f"step {1000 * p.step_s:.1f} ms + {1000 * p.step_cpu_s:.1f} ms CPU",
    ]
    if p.read_bytes:
        parts.append(
            f"{p.read_bytes / 2**20:.1f} MiB/batch from a {p.disk_bps / 1e6:.0f} MB/s disk"
        )
    if p.outside_load:
        parts.append(f"{p.outside_load:g} cores busy elsewhere")
    changes = []
    for c in scenario.changes:
        when = f"t={c.at:.1f}s" if c.at is not None else f"batch {c.at_batch}"
        what = {
            k: v
            for k, v in (
                ("outside_load", c.outside_load),
                ("cpu_factor", c.cpu_factor),
                ("read_factor", c.read_factor),
                ("step_factor", c.step_factor),
            )
            if v is not None
        }
        changes.append(f"{when}: " + ", ".join(f"{k}={v:g}" for k, v in what.items()))
    text = ", ".join(parts)
    if changes:
        shown = changes if len(changes) <= 6 else [*changes[:5], f"... {len(changes) - 5} more"]
        text += "\n  changes: " + "; ".join(shown)
    return text


def _run(
    scenario: Scenario, resolved: tuple[Policy | str, int | str] | None, args: argparse.Namespace
) -> SimRun:
    """Run a resolved --policy on ``scenario`` (None: the oracle-static search)."""
    from drapps.sim.run import oracle_static, simulate

    if resolved is None:
        return oracle_static(
            scenario, duration=args.duration, interval=args.interval, seed=args.seed
        )
    policy, workers = resolved
    if workers == ONE_PER_CORE:
        workers = min(scenario.pipeline.cores, scenario.pipeline.worker_limit)
    return simulate(
        scenario,
        policy,
        duration=args.duration,
        interval=args.interval,
        seed=args.seed,
        workers=workers,
    )


def simulate_command(args: argparse.Namespace) -> int:
    check_positive(args, "duration", "interval", "disk_slowdown", "cpu_slowdown", "step_slowdown")
    check_positive(args, "cores", minimum=1)
    try:
        scenario, origin = _scenario(args)
        resolved = None if args.policy == "oracle-static" else resolve_policy(args.policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"scenario: {origin}")
    print(f"  {_describe(scenario)}")
    variants = [("as is", scenario)]
    what_if = scenario.what_if(
        cores=args.cores,
        read_factor=args.disk_slowdown,
        cpu_factor=args.cpu_slowdown,
        step_factor=args.step_slowdown,
    )
    asked = [
        text
        for text, on in (
            (f"{args.cores} cores", args.cores is not None),
            (f"a {args.disk_slowdown:g}x slower disk", args.disk_slowdown != 1),
            (f"{args.cpu_slowdown:g}x slower CPUs", args.cpu_slowdown != 1),
            (f"a {args.step_slowdown:g}x slower training step", args.step_slowdown != 1),
        )
        if on
    ]
    if asked:
        variants.append(("with " + " and ".join(asked), what_if))
    summaries = []
    for label, variant in variants:
        run = _run(variant, resolved, args)
        summaries.append((label, run))
        print(f"\n{label}: policy {args.policy} ({run.policy}), {args.duration:g} s simulated")
        print("      t  workers  prefetch  samples/s  waited   cpu")
        every = max(1, round(args.print_every / args.interval))
        for k, tick in enumerate(run.ticks):
            if (k + 1) % every == 0:
                s = tick.state
                print(
                    f"  {s.t:5.1f}  {tick.workers:7d}  {tick.prefetch:8d}  {s.throughput:9.0f}  "
                    f"{s.wait_fraction:6.0%}  {s.cpu_util:4.0%}"
                )
        summary = run.summary()
        print(
            f"  => {summary['throughput']:.0f} samples/s, training loop waited "
            f"{summary['wait_fraction']:.0%}, {summary['final_workers']} workers at the end"
        )
    if len(summaries) == 2:
        (_, before), (label, after) = summaries
        change = after.throughput / max(before.throughput, 1e-9) - 1
        print(
            f"\n{label}: {change:+.0%} samples/s "
            f"({before.throughput:.0f} -> {after.throughput:.0f})"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps([{"variant": label, **run.summary()} for label, run in summaries], indent=2)
        )
    return 0


def train_policy_command(args: argparse.Namespace) -> int:
    from drapps.sim.families import check_families, family_names

    if args.offline and args.calibrate:
        raise UsageError("--offline and --calibrate are two ways to fine-tune: give one")
    if args.offline:
        return _finetune_offline(args)
    if args.calibrate:
        return _finetune_calibrated(args)
    if args.temperature is not None:
        raise UsageError("--temperature applies to --calibrate")
    args.learner = args.learner or "ppo"
    steps = args.steps if args.steps is not None else 100_000
    if steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")
    try:
        from drapps.control.rl import MlpPolicy
        from drapps.sim.env import PipelineEnv
        from drapps.sim.learners import make_learner

        learner = make_learner(args.learner)
        if args.start is not None:
            from drapps.sim.learners.rollout import RolloutConfig, RolloutPolicyIteration

            if not isinstance(learner, RolloutPolicyIteration):
                raise ValueError(
                    f"--from names the policy to start from with --offline or --learner "
                    f"rollout, not --learner {args.learner}"
                )
            MlpPolicy.load(args.start)  # refused here, before any training, if unreadable
            learner = RolloutPolicyIteration(RolloutConfig(start=args.start))
        # Only scenarios with movable ops give a split policy something to learn from.
        movable = ["device-offload"] if "split" in args.knobs else None
        if "offload" in args.knobs:  # scenarios with a share to move
            movable = [*(movable or []), "gpu-decode"]
        if "executor" in args.knobs:  # scenarios whose best executor changes
            movable = [*(movable or []), "gil-switch"]
        families = check_families(args.families or movable or family_names(held_out=False))
        held_out = check_families(args.evaluate_on or movable or family_names(held_out=True))
        env = PipelineEnv(
            families,
            duration=args.duration,
            knobs=args.knobs,
            continuous=learner.continuous,
            weights=args.reward,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"training {args.learner} for {steps} steps on {', '.join(families)}")
    start = time.perf_counter()
    policy = learner.train(env, steps, args.seed)
    trained_s = time.perf_counter() - start
    print(f"trained in {trained_s:.0f} s")
    policy.meta.update(
        {"families": families, "train_s": round(trained_s, 1), "interval": env.interval}
    )
    return _evaluate_and_save(args, policy, {"heuristic": "heuristic", "learned": policy}, held_out)


def _evaluate_and_save(
    args: argparse.Namespace,
    policy: MlpPolicy,
    compared: dict[str, Policy | str],
    held_out: list[str],
) -> int:
    """Score ``compared`` on ``args.episodes`` scenarios of each held-out family (none: 0),
    keep the table in ``policy``'s file, and write it to ``args.out``."""
    from drapps.sim.evaluate import evaluate

    if args.episodes > 0:
        result = evaluate(
            compared,
            held_out,
            episodes=args.episodes,
            duration=args.duration,
            seed=args.seed + 1,
            weights=args.reward,
        )
        print(f"\nheld-out families, {args.episodes} episodes each:")
        print(result.markdown())
        policy.meta["evaluation"] = result.table()
    _save(args, policy)
    print(f"\nwrote {args.out}")
    return 0


def _save(args: argparse.Namespace, policy: MlpPolicy) -> None:
    """Write ``policy`` to ``args.out``, with the reward weights it was trained on where
    ``--reward`` set them."""
    if args.reward is not None:
        policy.meta["reward"] = asdict(args.reward)
    policy.save(args.out)


def _finetune_calibrated(args: argparse.Namespace) -> int:
    """``train-policy --calibrate TRACES``: one rollout round in the simulator calibrated from
    real runs, starting from a policy and anchored to it over the training families."""
    from drapps.control.rl import MlpPolicy, shipped_path
    from drapps.sim.calibration import TraceFamily
    from drapps.sim.env import PipelineEnv
    from drapps.sim.families import check_families, family_names
    from drapps.sim.learners.rollout import RolloutConfig, RolloutPolicyIteration, episode_steps

    if args.learner not in (None, "rollout"):
        raise UsageError(f"--calibrate fine-tunes with --learner rollout, not {args.learner}")
    start_path = args.start or str(shipped_path())
    try:
        start = MlpPolicy.load(start_path)
        temperature = args.temperature if args.temperature is not None else 0.1
        config = RolloutConfig(start=start_path, temperature=temperature, passes=FIT_PASSES)
        held_out = check_families(args.evaluate_on or family_names(held_out=True))
        anchor = PipelineEnv(
            check_families(args.families or family_names(held_out=False)),
            duration=args.duration,
            knobs=start.knobs,
            weights=args.reward,
        )
        per_episode = episode_steps(anchor, config)
        steps = args.steps if args.steps is not None else CALIBRATED_EPISODES * per_episode
        if steps < 1:
            raise UsageError(f"--steps must be >= 1, got {steps}")
        print(f"calibrating the simulator from {len(args.calibrate)} trace(s)")
        family = TraceFamily.from_traces(args.calibrate)
        target = PipelineEnv(
            [family], duration=args.duration, knobs=start.knobs, weights=args.reward
        )
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    episodes = max(1, steps // per_episode)
    anchors = ANCHORS_PER_EPISODE * episodes
    source = args.start or "the shipped policy"
    print(
        f"fine-tuning {source}: every action tried from the States of {episodes} episodes of "
        f"the traced runs, held over {anchors} episodes of the training families"
    )
    began = time.perf_counter()
    learner = RolloutPolicyIteration(config)
    policy = learner.finetune(target, anchor, episodes, anchors, args.seed)
    trained_s = time.perf_counter() - began
    policy.meta["finetune"]["start"] = source
    policy.meta["finetune"]["traces"] = [Path(p).name for p in args.calibrate]
    policy.meta["finetune"]["train_s"] = round(trained_s, 1)
    done = learner.history[-1]
    print(
        f"fine-tuned in {trained_s:.0f} s: on the traced runs' States it gives up "
        f"{done['regret']:.2f} of return against the best action (the start: "
        f"{done['followed_regret']:.2f}), and keeps the start's choice on "
        f"{done['anchor_agreement']:.0%} of the training families' States"
    )
    compared: dict[str, Policy | str] = {
        "heuristic": "heuristic",
        "start": start,
        "fine-tuned": policy,
    }
    return _evaluate_and_save(args, policy, compared, held_out)


def _finetune_offline(args: argparse.Namespace) -> int:
    """``train-policy --offline TRACES``: CQL from real runs' traces, starting from a policy."""
    from drapps.control.rl import MlpPolicy
    from drapps.sim.learners.offline import finetune, transitions

    steps = args.steps if args.steps is not None else 5_000
    if steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")
    try:
        start_from = MlpPolicy.load(args.start) if args.start else MlpPolicy.shipped()
        data = transitions(
            args.offline, start_from.knobs, weights=args.reward, features=start_from.features
        )
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    source = args.start or "the shipped policy"
    print(
        f"fine-tuning {source} offline (CQL) for {steps} steps on {len(data)} transitions "
        f"from {len(args.offline)} trace(s)"
    )
    began = time.perf_counter()
    try:
        policy = finetune(start_from, data, steps, seed=args.seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    policy.meta["offline"]["traces"] = [str(Path(p).name) for p in args.offline]
    policy.meta["offline"]["train_s"] = round(time.perf_counter() - began, 1)
    print(f"fine-tuned in {time.perf_counter() - began:.0f} s")
    before = start_from.scores(data.observations).argmax(axis=1)
    after = policy.scores(data.observations).argmax(axis=1)
    agree, agreed = (after == data.actions).mean(), (before == data.actions).mean()
    print(
        f"on the traces' states it picks the traces' own action {agree:.0%} of the time "
        f"(before: {agreed:.0%}), and changes "
        f"{(after != before).mean():.0%} of the starting policy's choices"
    )
    _save(args, policy)
    print(f"wrote {args.out}")
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    from drapps.sim.evaluate import BASELINES, evaluate
    from drapps.sim.families import check_families, family_names

    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    try:
        families = check_families(args.families or family_names())
        policies = {}
        for name in args.policies:
            policy, workers = resolve_policy(name) if name not in BASELINES else (name, None)
            if workers not in ("auto", ONE_PER_CORE):
                # The table compares policies that run a Loader(workers="auto"); fixed counts
                # would be run as "static" under a wrong name.
                raise ValueError(
                    f"--policies takes policies that move the workers (heuristic, rl, static, "
                    f"a .npz); {', '.join(BASELINES)} are always in the table, got {name!r}"
                )
            policies[name] = policy
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    start = time.perf_counter()
    result = evaluate(
        policies, families, episodes=args.episodes, seed=args.seed, weights=args.reward
    )
    table = result.markdown()
    print(table)
    elapsed = time.perf_counter() - start
    print(f"\n{args.episodes} episodes per family, seed {args.seed}, {elapsed:.0f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result.table(), indent=2))
        (out / "results.md").write_text(table + "\n")
    return 0


def add_commands(commands: Commands) -> None:
    """Add ``simulate``, ``evaluate-policy`` and ``train-policy``."""
    simulate = commands.add_parser(
        "simulate",
        help="run a policy in the pipeline simulator; what-if questions from a trace",
        description="Simulate a pipeline drawn from a scenario family, or one calibrated from "
        "a real run's trace (Loader(trace=...)), under a policy; print the run. --cores, "
        "--disk-slowdown, --cpu-slowdown and --step-slowdown ask what would change on other "
        "hardware: the run is shown as is and with the change.",
    )
    from drapps.sim.families import family_names

    simulate.add_argument(
        "--scenario",
        required=True,
        help="a trace .jsonl, or a scenario family: " + ", ".join(family_names()),
    )
    simulate.add_argument("--policy", default="heuristic", help=POLICY_HELP)
    simulate.add_argument("--cores", type=int, help="what if the machine had this many cores")
    simulate.add_argument("--disk-slowdown", type=float, default=1.0, help="2 = twice as slow")
    simulate.add_argument("--cpu-slowdown", type=float, default=1.0, help="2 = twice as slow")
    simulate.add_argument("--step-slowdown", type=float, default=1.0, help="0.5 = twice as fast")
    simulate.add_argument("--duration", type=float, default=60.0, help="simulated seconds (60)")
    simulate.add_argument("--interval", type=float, default=0.5, help="controller tick (0.5 s)")
    simulate.add_argument("--seed", type=int, default=0, help="scenario draw and costs (0)")
    simulate.add_argument("--print-every", type=float, default=5.0, help="seconds per line (5)")
    simulate.add_argument("--out", help="write the summaries as JSON here")
    simulate.set_defaults(run=simulate_command)
    evaluation = commands.add_parser(
        "evaluate-policy",
        help="compare policies on simulated scenario families",
        description="Run each policy, the oracle-static and the DataLoader default on the "
        "same scenarios of each family; print throughput relative to the oracle, wait, reward "
        "and time to settle after changes.",
    )
    evaluation.add_argument(
        "--policies", type=name_list, default=("heuristic", "rl"), help="default heuristic,rl"
    )
    evaluation.add_argument("--families", type=name_list, help="default: every family")
    evaluation.add_argument("--episodes", type=int, default=8, help="per family (8)")
    evaluation.add_argument("--seed", type=int, default=0, help="scenario draws (0)")
    evaluation.add_argument("--out", help="folder for results.json and results.md")
    evaluation.add_argument("--reward", type=reward_weights, metavar="NAME=W,...", help=REWARD_HELP)
    evaluation.set_defaults(run=evaluate_command)
    train = commands.add_parser(
        "train-policy",
        help="train the learned policy in the simulator (needs the 'rl' extra)",
        description="Train a policy on the simulator's training scenario families, evaluate "
        "it against the heuristic on the held-out families, and write it as a .npz that "
        "drapps runs with NumPy (MlpPolicy.load, or Loader(policy=MlpPolicy.load(path))).",
    )
    train.add_argument("--learner", help="ppo (default), sac, ddqn or rollout")
    train.add_argument(
        "--steps",
        type=int,
        help="environment steps (100000); with --offline, gradient steps (5000)",
    )
    train.add_argument(
        "--offline",
        nargs="+",
        metavar="TRACE",
        help="fine-tune offline (CQL, needs d3rlpy) from these trace= files of real runs "
        "instead of training in the simulator",
    )
    train.add_argument(
        "--calibrate",
        nargs="+",
        metavar="TRACE",
        help="fine-tune in the simulator calibrated from these trace= files of real runs: "
        "every action tried from the States those runs reach (a rollout round), the policy "
        "held where the training families go",
    )
    train.add_argument(
        "--temperature",
        type=float,
        help="with --calibrate: return per unit of the policy's score (0.1); smaller lets "
        "the traced runs' returns move the policy further",
    )
    train.add_argument(
        "--from",
        dest="start",
        metavar="POLICY",
        help="the .npz policy to start from: with --offline or --calibrate (default: the "
        "shipped one), or "
        "the policy --learner rollout's first round follows (default: the heuristic)",
    )
    train.add_argument("--reward", type=reward_weights, metavar="NAME=W,...", help=REWARD_HELP)
    train.add_argument("--seed", type=int, default=0, help="seed (0)")
    train.add_argument("--families", type=name_list, help="training families (default: all)")
    train.add_argument("--evaluate-on", type=name_list, help="default: the held-out families")
    train.add_argument("--episodes", type=int, default=6, help="per held-out family (6)")
    train.add_argument("--duration", type=float, default=60.0, help="episode seconds (60)")
    train.add_argument("--out", default="drapps-policy.npz", help="policy file to write")
    train.add_argument(
        "--knobs",
        type=name_list,
        default=("workers", "prefetch"),
        help="step knobs the policy moves (workers,prefetch; add split to learn the device "
        "stage's cut, with --families device-offload or others with movable ops; add offload "
        "for the share of each batch finished there, on gpu-decode; add lookahead for how far "
        "ahead predicted-slow work starts, which acts where batches are cut into parts; add "
        "codec for the sample cache's codec, which acts where a family has a cache; add "
        "priority for the workers' CPU priority; add executor for worker processes or threads, "
        "on gil-switch)",
    )
    train.set_defaults(run=train_policy_command)
