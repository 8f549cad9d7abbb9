"""Default NNQS-SCI settings, in one place (the Runner, the CLI and the benchmarks read them)."""

DEFAULT_TOPK = 1024
"""Configurations added to S per iteration."""

DEFAULT_REFERENCE_BIAS = 5.0
"""Extra logit for the Hartree-Fock token at each position of a fresh ansatz."""

DEFAULT_LR = 1e-3
"""AdamW learning rate. The published method uses 3e-4; at 3e-4 the fresh-start runs on
the small benchmark set needed several times more iterations to reach chemical accuracy
(`benchmarks/accuracy_small.py`), so the default is 1e-3 and 3e-4 stays one argument away."""

DEFAULT_ITERATIONS = 2000
"""Iterations of `cuscikit nnqs` and of the accuracy benchmark, with the inner steps and the
tail decay of the rate below. On two H200s (compiled inference, seed 0, `benchmarks/
device_accuracy.sh`, 2026-11-30) every system of the small and hard sets was within 1.6 mHa of
FCI by both estimators, and stayed so, from iteration 32 (LiH) to 1194 (H8 chain); Li2O, the
slowest, from 1036 (+0.426 mHa at 1945). Before the inner steps the default was 4000 constant-rate
iterations, and Li2O still ended at +3.60 mHa and the H8 chain at +3.02."""

DEFAULT_GROWTH = "count"
"""How S grows for a molecule (``Runner(growth="auto")``): the top-K by |psi| up to
`DEFAULT_MAX_SPACE`, the rule the molecular defaults were chosen with. A lattice model takes
`DEFAULT_LATTICE_GROWTH`."""

DEFAULT_LATTICE_GROWTH = "weight"
"""How S grows for a lattice model (``Runner(growth="auto")`` on a `Molecule.hubbard`): by the
first-order weight, the memory budget the only hard limit. The ground state of a half-filled
lattice spreads over a large part of its determinant space: on the 10-site chain at U = 4 the
best space of the count cap (16,384 of 63,504 determinants) is 13.3 mHa above FCI, the weight
rule's (31,748) within 0.0001 mHa; on the set's 6- and 8-site lattices both rules met the goals
on three seeds (docs/nnqs_sci.md, "#weight-set")."""

DEFAULT_MAX_SPACE = 16384
"""Cap on |S| (the configurations of smallest |psi| are dropped beyond it); None: no cap."""

DEFAULT_WEIGHT_ADD = 1e-9
"""growth="weight": the least first-order weight |c_a|^2 of a configuration added to S. The
largest threshold tried whose space error (exact energy within the final S minus FCI) stays
below 0.01 mHa on LiH and H2O (network runs, CPU, seed 0, 60 iterations: 1e-7 left 0.0019 and
0.0037 mHa) and on the 10-site Hubbard chains and ring (growth from the exact CI vector of S:
1e-7 left 4.3-6.2 mHa, 1e-8 0.12-0.25, 1e-9 0.004-0.008); docs/nnqs_sci.md, "Growth by
weight"."""

DEFAULT_WEIGHT_PRUNE = None
"""growth="weight": S drops the tail of smallest |psi| whose share of sum |psi|^2 is at most
this, every iteration (None: no pruning). Off, because a configuration enters S with the
untrained network's |psi| and is pruned again before it has learnt its amplitude: on the 8-site
Hubbard chain (U = 4, seed 0) a share of 1e-6 dropped 40-392 configurations per iteration and
|S| see-sawed (docs/nnqs_sci.md, "Growth by weight")."""

DEFAULT_INNER_STEPS = 4
"""Extra AdamW steps per iteration on the energy within S (`Runner(inner_steps=...)`). Each is a
forward and backward pass over S, no inference over the coupled set: for Li2O (|S| = 16,384) on
an H200 the optimiser stage, the iteration's backward pass and four inner steps, took 0.12 s of
the 0.70 s of an iteration, the inference over the coupled set 0.57 s. On a CPU
and a small system, where the coupled set is not much larger than S, a step costs about as much
as a plain iteration; `inner_steps=0` gives the published plain method (docs/nnqs_sci.md)."""

DEFAULT_LR_FINAL = 1e-4
"""The AdamW rate falls geometrically to this at the last iteration of a run (the command line
and the benchmarks; in Python, `LearningRateDecay.over_tail(iterations)`). A constant rate
leaves single-iteration error spikes at the end of a run (Li2O: +12.96 mHa at iteration 3201
between +3.81 and +5.06)."""

DEFAULT_LR_DECAY_FROM = 0.5
"""The decay starts after this fraction of the run's iterations."""

DEFAULT_TEACHER = 1.0
"""Weight of the selected-CI teacher at iteration 1 (`Runner(teacher=...)`; 0: off). On by
default (``teacher="auto"``, on one rank or several), with its inner-step schedule
(`DEFAULT_TEACHER_INNER_STEPS`, `DEFAULT_TEACHER_GAP`) and its hold (`DEFAULT_TEACHER_HOLD`).
Without the hold (H200, three seeds, 400-iteration schedules, 800 for the 8-site Hubbard
chains) every case of the
molecule-and-lattice set up to 8 sites ended within 1.6 mHa, and 29 of the 30 runs within 0.5 mHa
after the PT2 correction (the U = 8 chain, seed 1: 0.523); with it, all 30 runs within both,
at most 0.144 mHa; before, with the teacher off and 4 inner steps,
H2O ended at 18.5 mHa, the H8 chain at 29.6, the stretched N2 at 26.2 (docs/nnqs_sci.md,
"#teacher-schedule", "#teacher-hold")."""

DEFAULT_TEACHER_UNTIL = 200
"""The iteration from which the teacher's weight is 0 (it falls linearly from iteration 1)."""

DEFAULT_TEACHER_INNER_STEPS = 16
"""Inner steps of an iteration on a CUDA device (``teacher_inner_steps="auto"``; a CPU takes
`DEFAULT_INNER_STEPS`, where an inner step costs about as much as the iteration's inference: the
N2 demo's iteration took 8.8 CPU s with 16 and the teacher, 2.9 with 4 and the teacher, 3.3
without it) while the teacher's weight is above 0, and after it while the network's variational
energy trails the CI energy of S (known without a new eigensolve: S unchanged since the teacher's
last one) by more than `DEFAULT_TEACHER_GAP` (with `DEFAULT_TEACHER_HOLD` the teacher's weight
itself is held on that test, and the inner steps end with the weight, once); `DEFAULT_INNER_STEPS`
otherwise. With 4 inner steps the teacher left two 6-site ring runs (of 30 on the set) worse than
without it; with 16 none."""

DEFAULT_LATTICE_TEACHER_INNER_STEPS = 32
"""The teacher's inner steps for a lattice model (``teacher_inner_steps="auto"`` on a
`Molecule.hubbard`, on any device). The network, not S, limits a lattice run: on the 10-site
chain at U = 4 (weight rule, 2000-iteration schedule, H200, seed 0) 16 steps ended at 1.741 mHa
and 32 at 0.358; on the 2-core CPU the 8-site chain at U = 4 ended 15 times above the goals
with `DEFAULT_INNER_STEPS` (docs/nnqs_sci.md, "#inner32", "#lattice-defaults")."""

DEFAULT_TEACHER_GAP = 1e-4
"""Energy (Ha, or t) by which the network may trail the CI energy of an unchanged S before the
teacher's inner steps stop (None: they stop with the teacher's weight), and the test that
releases the hold (`DEFAULT_TEACHER_HOLD`)."""

DEFAULT_TEACHER_HOLD = 1.0
"""The teacher's weight is held at no less than this fraction of its weight at iteration 1
(`Runner(teacher_hold=...)`; 0: the linear fall alone) while the network's variational energy
trails the CI energy of S by more than `DEFAULT_TEACHER_GAP`, each new S solved (with
`Runner(teacher_resolve=False)` after `DEFAULT_TEACHER_UNTIL` only while S is unchanged, and
released when it changes). Released once the gap closes and for good, so the inner-step count
changes once a run. In the runs below S stopped changing before `DEFAULT_TEACHER_UNTIL`, where both
rules are the same run. On an H200 (three seeds, the schedules of `DEFAULT_TEACHER`'s measurement:
400 iterations, 800 for the 8-site Hubbard chains) the 8-site chain at U = 8 ended at 0.144 / 0.085
/ 0.117 mHa (1e-3 t; without the hold 0.237 / 0.523 / 0.414, a miss of the 0.5-mHa PT2 goal), and
every one of the 30 runs (LiH in a later call: at most 0.0001 mHa) within 0.144 mHa by both
estimators and after PT2. A few seeds ended higher than without the hold, by up to 0.05 mHa (the
6-site ring at U = 8, seed 1: 0.085 -> 0.136). Every run released the hold, at an error of at most
0.1 mHa (docs/nnqs_sci.md, "#teacher-hold")."""
