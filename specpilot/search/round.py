"""One round of the search, as a named list of steps (read top to bottom in `run_round`):

    measure the base          time the round's base Program; the spread of its runs is the noise
    cost report               roofline + calibration -> the gap to the ceiling by category
    rank directions           agents ordered by the gap of the categories they address
    propose                   agents in parallel (worker pool); memory seeds in round 1
    evaluate the seeds        round 1 only: the memory's seeds that compose, as one candidate,
                              evaluated first; if it is admitted the round ends with it (the
                              agents' proposals wait for the next round, made from it)
    select candidates         distinct, untried Programs; each direction gets its share of the
                              budget, shares a direction cannot fill go to the others
    build candidates          lowered and built in parallel
    evaluate                  one at a time: token forcing first, then timing alternately with
                              the base; admitted only if forcing is clean, the unforced output
                              equals the reference up to reported near-tie divergences
                              (output_check.py), and the gain exceeds the base's run-to-run spread
    stack winners             from the best admitted candidate, each next one (by gain) added
                              to the stack, forced and timed again, and kept only if the stack
                              with it is admitted and gains more than the noise beyond the stack
                              without it (stacking.py)

Every proposal that does not make it is an Outcome with its stage and reason.
"""
from __future__ import annotations

import concurrent.futures as cf
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from specpilot.agents import Budget, ProposalSet, refusal
from specpilot.cost import CostModel, CostReport
from specpilot.cost.acceptance import program_accepted_lengths
from specpilot.ir import Program, program_id

from .candidates import Candidate, Outcome, make_candidate, prepare
from .output_check import check_output
from .seeding import MEMORY, memory_proposals, seeded_candidate
from .stacking import ranked_winners, stack_winners


@dataclass
class RoundInputs:
    """What a round works with (all passed in; nothing is read from elsewhere)."""
    index: int
    base: Program
    cost_model: CostModel
    acceptance: object
    evaluator: object
    agents: list
    memory: object                            # MemoryView
    settings: object                          # CompileSettings
    kernel_cache_dir: str
    context: int
    tried: Dict[str, List[Outcome]] = field(default_factory=dict)  # program id -> outcomes
    progress: Callable[[str], None] = print


@dataclass
class RoundResult:
    index: int
    base: Program
    program: Program                          # the round's winner (the base if none)
    chosen: str                               # label of what was chosen
    base_timing: dict                         # Timing.to_json() of the base, this round
    timing: dict                              # ... of the chosen Program
    forcing: Optional[dict]
    cost_report: CostReport
    ranking: List[tuple]
    proposals: List[ProposalSet]
    outcomes: List[Outcome]
    threshold: float
    cost_model: CostModel
    chosen_report: Optional[CostReport] = None    # the winner under the final calibration
    gain: Optional[float] = None                  # the winner's gain, timed alternately
    output: Optional[dict] = None                 # the winner's unforced-output check
    notes: List[str] = field(default_factory=list)


def noise_threshold(base_timing, min_gain: float) -> float:
    """The gain a candidate must exceed: the base's run-to-run spread, at least `min_gain`."""
    return max(base_timing.spread, min_gain)


def rank_directions(agents, report: CostReport) -> List[tuple]:
    """(score, agent) best first: the gap (s/token) of the categories the agent addresses; an
    agent without categories (the LLM) scores the whole gap."""
    total = sum(report.gap_per_token_s.values())
    scored = [(sum(report.gap_per_token_s.get(c, 0.0) for c in a.categories)
               if a.categories else total, a) for a in agents]
    scored.sort(key=lambda pair: -pair[0])
    return scored


def budgets(ranking: List[tuple], total: int, llm_budget: int) -> Dict[str, int]:
    """Each agent's share of `total` candidates, proportional to its gap score, at least one;
    the LLM agent gets `llm_budget` on top. (`select` hands shares an agent cannot use to the
    others.)"""
    built_in = [(s, a) for s, a in ranking if a.direction != "llm"]
    score_sum = sum(s for s, _ in built_in) or 1.0
    out = {a.direction: max(1, math.floor(total * s / score_sum)) for s, a in built_in}
    spare = total - sum(out.values())
    for _, a in built_in:          # hand what rounding left over to the best ranked first
        if spare <= 0:
            break
        out[a.direction] += 1
        spare -= 1
    out.update({a.direction: llm_budget for _, a in ranking if a.direction == "llm"})
    return out


def propose(inputs: RoundInputs, agents, report: CostReport,
            shares: Dict[str, int]) -> List[ProposalSet]:
    """Every agent proposes, in parallel; one that raises is recorded, not fatal. The sets come
    back in the order of `agents` (the ranking), memory seeds first in round 1."""
    def one(agent) -> ProposalSet:
        out = ProposalSet(agent.direction)
        try:
            # Every agent may propose a full round's worth; `select` applies the shares.
            limit = (shares.get(agent.direction, 1) if agent.direction == "llm"
                     else inputs.settings.candidates_per_round + len(inputs.tried))
            out.proposals = list(agent.propose(inputs.base, report, inputs.memory,
                                               Budget(limit)))
        except Exception as exc:    # an agent's bug must not end the compile
            out.error = f"{type(exc).__name__}: {exc}"
        out.notes, out.refusals = list(agent.notes), list(agent.refusals)
        return out

    with cf.ThreadPoolExecutor(max_workers=max(1, len(agents))) as pool:
        sets = list(pool.map(one, agents))
    if inputs.index == 1 and inputs.memory is not None:
        sets.insert(0, memory_proposals(inputs.base, inputs.memory,
                                        inputs.settings.memory_seeds))
    return sets


def worth_trying(earlier: List[Outcome]) -> bool:
    """A Program is evaluated again only if it was never evaluated, or once, faster than its
    base but not by more than that round's noise (a second measurement may settle it)."""
    if not earlier:
        return True
    return (len(earlier) == 1 and earlier[0].stage == "not_admitted"
            and (earlier[0].gain or 0.0) > 0.0)


def _candidates(inputs: RoundInputs, sets: List[ProposalSet], evaluated_ids=()):
    """Proposals -> candidates: ({direction: [Candidate, ...]} in the sets' order, one per
    distinct Program not tried before nor among `evaluated_ids`; the outcomes of the proposals
    left out)."""
    outcomes: List[Outcome] = []
    seen = {program_id(inputs.base), *evaluated_ids}
    by_direction: Dict[str, List[Candidate]] = {}
    for s in sets:
        for r in s.refusals:
            outcomes.append(Outcome(r.proposal, s.direction, "proposal", r.reason))
        if s.error:
            outcomes.append(Outcome(f"{s.direction} agent", s.direction, "proposal", s.error))
        mine = by_direction.setdefault(s.direction, [])
        for t in s.proposals:
            reason = refusal(inputs.base, t)       # never trust a proposal: check it again
            if reason is not None:
                outcomes.append(Outcome(str(t), s.direction, "proposal", reason,
                                        transformations=(t,)))
                continue
            c = make_candidate(inputs.base, (t,), s.direction)
            if c.id in seen:
                continue
            seen.add(c.id)
            if worth_trying(inputs.tried.get(c.id, [])):
                mine.append(c)
    return by_direction, outcomes


def select(by_direction: Dict[str, List[Candidate]], shares: Dict[str, int],
           total: int) -> List[Candidate]:
    """Each direction's candidates (best first) cut to its share of `total`; slots a direction
    leaves unused go to the others in order. Memory seeds and the LLM agent come on top."""
    extra_kinds = (MEMORY, "llm")
    ranked = [d for d in by_direction if d not in extra_kinds]
    kept, used = {}, 0
    for d in ranked:
        kept[d] = by_direction[d][:max(0, min(shares.get(d, 1), total - used))]
        used += len(kept[d])
    for d in ranked:
        if used >= total:
            break
        more = by_direction[d][len(kept[d]):][:total - used]
        kept[d] += more
        used += len(more)
    out = [c for d in by_direction if d in extra_kinds for c in by_direction[d]]
    return out + [c for d in ranked for c in kept[d]]


def evaluate(inputs: RoundInputs, candidate: Candidate, threshold: float) -> Outcome:
    """Force, then time one candidate alternately with the base; refit the cost model's
    calibration on its timing."""
    ev = inputs.evaluator
    out = Outcome(candidate.label, candidate.direction, "forcing", program_id=candidate.id,
                  transformations=candidate.transformations)
    try:
        report = ev.force(candidate.program)
    except Exception as exc:          # a kernel that crashes at run time is a failed candidate
        out.reason = f"could not run: {type(exc).__name__}: {exc}"
        return out
    out.forcing = report.to_json()
    if not report.passed:
        out.reason = report.format().splitlines()[0]
        return out
    try:
        timing, base_timing, gain = ev.time_paired(candidate.program, inputs.base,
                                                   inputs.settings.timing_repeats)
    except Exception as exc:
        out.stage, out.reason = "output", f"timed run failed: {type(exc).__name__}: {exc}"
        return out
    out.timing = timing.to_json()
    # the same near-tie rule, tolerance and reference margins as the forcing report
    output = check_output(timing.divergences, len(ev.prompts), report.tolerance)
    out.output = output.to_json()
    if not output.passed:
        out.stage, out.reason = "output", output.reason()
        return out
    error = _calibrate(inputs, candidate.program, candidate.label, timing)
    if error is not None:
        out.prediction_error = error
        out.predicted_tokens_per_s = timing.tokens / (timing.median_seconds * (1 + error))
    out.gain = gain
    out.timing["paired_base_tokens_per_s"] = base_timing.tokens_per_s
    if out.gain > threshold:
        out.stage = "admitted"
    else:
        out.stage = "not_admitted"
        out.reason = (f"gain {out.gain:+.1%} does not exceed the run-to-run spread "
                      f"{threshold:.1%}")
    return out


def predict_workload(inputs: RoundInputs, program: Program) -> Optional[float]:
    """Tokens/s the calibrated cost model predicts for `program` on the evaluated workload."""
    if program_accepted_lengths(program, inputs.acceptance) is None:
        return None
    ev = inputs.evaluator
    return inputs.cost_model.predict_speculative_run(
        program, inputs.acceptance, [len(p) for p in ev.prompts], ev.new_tokens).tokens_per_s


def _calibrate(inputs: RoundInputs, program: Program, label: str, timing) -> Optional[float]:
    """Predict the timed run, refit the calibration on the measurement; returns the relative
    error of the prediction made before refitting (None when the run cannot be predicted)."""
    ev = inputs.evaluator
    if program_accepted_lengths(program, inputs.acceptance) is None:
        return None
    lengths = [len(p) for p in ev.prompts]
    prediction = inputs.cost_model.predict_speculative_run(program, inputs.acceptance, lengths,
                                                           ev.new_tokens)
    inputs.cost_model = inputs.cost_model.calibrated(label, timing.median_seconds, prediction)
    return prediction.seconds / timing.median_seconds - 1.0


@dataclass
class Choice:
    program: Program
    label: str
    outcome: Optional[Outcome] = None        # None: the base stays


def choose(inputs: RoundInputs, ready: List[Candidate], evaluated: List[Outcome],
           threshold: float):
    """The round's winner: the admitted candidates stacked greedily from the one with the
    largest gain, each next one kept only if the stack with it is admitted and gains more than
    the noise beyond the stack without it (stacking.py); the best one alone when nothing stacks.
    A stack's Program evaluated before (this round, or in an earlier one and not worth trying
    again) is not evaluated again. Returns (Choice, outcomes of the stacks' evaluations and
    builds)."""
    ranked = ranked_winners(evaluated)
    if not ranked:
        return Choice(inputs.base, "no change (nothing admitted)"), []
    best = ranked[0]
    best_program = next(c for c in ready if c.id == best.program_id).program
    known = {o.program_id: o for o in evaluated if o.program_id}
    outcomes: List[Outcome] = []
    tag = f"[round {inputs.index}] stacked"

    def trial(candidate: Candidate, shown: str) -> Optional[Outcome]:
        if candidate.id in known:
            o = known[candidate.id]
            inputs.progress(f"{tag} {shown}: evaluated before as {o.label}: {o.stage}")
            return o
        if not worth_trying(inputs.tried.get(candidate.id, [])):
            inputs.progress(f"{tag} {shown}: evaluated in an earlier round, not again")
            return None
        built, failed = prepare([candidate], inputs.kernel_cache_dir, inputs.settings.workers)
        outcomes.extend(failed)
        if not built:
            inputs.progress(f"{tag} {shown}: {failed[0].stage} failed: {failed[0].reason}")
            return None
        o = evaluate(inputs, candidate, threshold)
        outcomes.append(o)
        known[candidate.id] = o
        inputs.progress(f"{tag} {shown}: {o.stage}"
                        + (f" ({o.gain:+.1%})" if o.gain is not None else ""))
        return o

    # with nothing stacked, the stack is the best winner alone (its Program, label, outcome)
    stack = stack_winners(inputs.base, ranked, best_program, trial, threshold)
    return Choice(stack.program, stack.label, stack.outcome), outcomes


def _shown(o: Outcome) -> str:
    return f"{o.tokens_per_s:,.1f} tok/s ({o.gain:+.1%})" if o.gain is not None else o.reason


def evaluate_seeds(inputs: RoundInputs, sets: List[ProposalSet], threshold: float
                   ) -> Tuple[Optional[Candidate], Optional[Outcome], List[Outcome]]:
    """The memory's seeds that compose, as one candidate, built and evaluated before anything
    else (mechanisms validated on alike deployments are the likeliest to pass here too).
    Returns (the candidate and its evaluation, when it was evaluated; build failures)."""
    seeded = seeded_candidate(inputs.base, sets)
    if seeded is None or not worth_trying(inputs.tried.get(seeded.id, [])):
        return None, None, []
    ready, failed = prepare([seeded], inputs.kernel_cache_dir, inputs.settings.workers)
    if not ready:
        return None, None, failed
    o = evaluate(inputs, seeded, threshold)
    inputs.progress(f"[round {inputs.index}] memory seeds, first: {seeded.label}: {o.stage}; "
                    f"{_shown(o)}")
    return seeded, o, failed


def run_round(inputs: RoundInputs) -> RoundResult:
    say, s = inputs.progress, inputs.settings
    tag = f"[round {inputs.index}]"
    say(f"{tag} measuring the base ({s.baseline_repeats} runs)")
    base_timing = inputs.evaluator.time(inputs.base, s.baseline_repeats)
    predicted_base = _calibrate(inputs, inputs.base, f"round {inputs.index} base", base_timing)
    base_tps = base_timing.median_tokens_per_s
    threshold = noise_threshold(base_timing, s.min_gain)

    report = inputs.cost_model.report(inputs.base, inputs.acceptance, s.batch_size, inputs.context)
    report.measured_tokens_per_s = base_tps
    if predicted_base is not None:
        report.prediction_error = predicted_base
    say(f"{tag} base {base_tps:,.1f} tok/s (spread {base_timing.spread:.1%}); steady-state "
        f"{report.tokens_per_s:,.1f}, ceiling {report.ceiling_tokens_per_s:,.1f}; dominant gap: "
        f"{report.dominant}")

    ranking = rank_directions(inputs.agents, report)
    shares = budgets(ranking, s.candidates_per_round, s.llm_budget)
    sets = propose(inputs, [a for _, a in ranking], report, shares)
    say(f"{tag} proposals: " + ", ".join(f"{p.direction} {len(p.proposals)}" for p in sets))

    seeded, seeded_outcome, outcomes = evaluate_seeds(inputs, sets, threshold)
    ready = [seeded] if seeded is not None else []
    evaluated: List[Outcome] = [seeded_outcome] if seeded_outcome is not None else []
    outcomes += evaluated
    notes: List[str] = []
    if seeded_outcome is not None and seeded_outcome.admitted:
        waiting = sum(len(p.proposals) for p in sets if p.direction != MEMORY)
        notes.append(f"the memory's seeds ({seeded.label}) were evaluated first, together, and "
                     f"admitted: the round ends with them; the agents' {waiting} proposals are "
                     f"not evaluated, the agents propose again in the next round, from this "
                     f"Program")
        say(f"{tag} {notes[-1]}")
    else:
        by_direction, refused = _candidates(inputs, sets, [c.id for c in ready])
        outcomes += refused
        candidates = select(by_direction, shares, s.candidates_per_round)
        say(f"{tag} {len(candidates)} new candidates")
        built, failed = prepare(candidates, inputs.kernel_cache_dir, s.workers)
        outcomes += failed
        for i, c in enumerate(built, start=1):
            o = evaluate(inputs, c, threshold)
            evaluated.append(o)
            outcomes.append(o)
            say(f"{tag} candidate {i}/{len(built)} {c.label}: {o.stage}; {_shown(o)}")
        ready += built

    chosen, combined = choose(inputs, ready, evaluated, threshold)
    outcomes += combined
    chosen_program, chosen_label = chosen.program, chosen.label
    if chosen.outcome is None:
        chosen_timing, chosen_forcing, chosen_gain = base_timing.to_json(), None, None
        chosen_output = None
    else:
        o = chosen.outcome
        chosen_timing, chosen_forcing, chosen_gain, chosen_output = (o.timing, o.forcing, o.gain,
                                                                     o.output)
    chosen_report = inputs.cost_model.report(chosen_program, inputs.acceptance, s.batch_size,
                                             inputs.context)
    chosen_report.measured_tokens_per_s = chosen_timing["median_tokens_per_s"]
    chosen_timing = dict(chosen_timing,
                         predicted_tokens_per_s=predict_workload(inputs, chosen_program))
    return RoundResult(inputs.index, inputs.base, chosen_program, chosen_label,
                       base_timing.to_json(),
                       chosen_timing, chosen_forcing, report, ranking, sets, outcomes, threshold,
                       inputs.cost_model, chosen_report, chosen_gain, chosen_output, notes)
