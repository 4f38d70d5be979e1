"""The search: rounds of proposals, candidate evaluation (token forcing, then timing), the run
folder, and resumable compiles.

    settings.py     CompileSettings
    evaluate.py     Evaluator: the stock reference, forcing and timing on the device
    candidates.py   Candidate, Outcome; lowering and building in parallel
    output_check.py the unforced output against the reference (near-tie divergences reported)
    seeding.py      composing mechanisms: the memory's seeded candidate, the round's winners
    stacking.py     the round's winners stacked greedily, each kept only if it pays on the stack
    round.py        run_round: one round as a named list of steps
    evaluations.py  candidate evaluations in all and until the best Program was reached
    round_io.py     round 0 and what each round writes and records
    run_folder.py   the run folder, written atomically, reconciled on resume
    escapes.py      lossless12 escape rates measured from the checkpoints
    compile.py      compile_deployment
"""
