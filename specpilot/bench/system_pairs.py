"""Which pair of models each mechanism Program runs on in the bench: the pair the bench loaded,
or a copy sharing its weights with the drafter in fused kernels, the generated attention, whole
layers compiled, as the Program's kernels say (runtime/decoder.py builds each copy). A copy that
cannot be built is the reason why, which the Program's system reports as its refusal."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Optional, Tuple, Union

from specpilot.ir import Program
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.decoder import (ModelPair, with_fast_path, with_fused_drafter,
                                       with_generated_attention)
from specpilot.runtime.fast_ops import LAYERS


def fused_drafter_pair(pair: ModelPair) -> Union[ModelPair, str]:
    """`pair` with its drafter in fused layer kernels (runtime/decoder.py's
    `with_fused_drafter`), or why it cannot be."""
    return _built_or_why(with_fused_drafter, pair)


def _built_or_why(build: Callable[[ModelPair], ModelPair], pair: ModelPair
                  ) -> Union[ModelPair, str]:
    """`build(pair)`, or the reason it refused (its SpecPilotError's message)."""
    try:
        return build(pair)
    except SpecPilotError as exc:
        return str(exc)


class SystemPairs:
    """The pair each mechanism Program runs on, each kind built once and shared by the systems
    that ask for it: the pair itself, with its drafter in fused kernels
    (kernels.drafter_kernels "fused"), with the generated attention
    (kernels.attention_kernels "generated"), or both; each of these on compiled whole layers
    (kernels.fast_path "layers") where the Program asks, the pair being loaded per op. Greedy
    AR with the generated attention gets the target alone: a drafter it never runs cannot
    refuse it."""

    def __init__(self, pair: ModelPair):
        self.pair = pair
        self._built: Dict[Tuple[bool, bool, bool, bool], Union[ModelPair, str]] = {
            (False, False, True, False): pair}

    def _build(self, fused: bool, attention: bool, drafter: bool = True,
               layers: bool = False) -> Union[ModelPair, str]:
        key = (fused, attention, drafter, layers)
        if key not in self._built:
            if layers:
                base = self._build(fused, attention, drafter)
                self._built[key] = (base if isinstance(base, str) else
                                    _built_or_why(lambda p: with_fast_path(p, LAYERS), base))
            elif not drafter:
                self._built[key] = generated_attention_pair(replace(self.pair, drafter=None))
            elif attention:
                base = self._build(fused, False)
                self._built[key] = (base if isinstance(base, str)
                                    else generated_attention_pair(base))
            else:
                self._built[key] = fused_drafter_pair(self.pair)
        return self._built[key]

    def for_program(self, program: Program) -> Tuple[ModelPair, Optional[str]]:
        """(the pair `program` runs on, why it cannot run or None). Where it cannot, the
        original pair with the reason alone: the unfused pair's own refusals (a pair built
        for other kernels) would only mislead."""
        k = program.kernels
        fused, attention = k.drafter_kernels == "fused", k.attention_kernels == "generated"
        built = self._build(fused, attention, program.draft.speculates or not attention,
                            k.fast_path == LAYERS)
        if isinstance(built, ModelPair):
            return built, None
        if fused and isinstance(self._build(True, False), str):
            return self.pair, f"the drafter has no fused kernels: {built}"
        return self.pair, built          # with_generated_attention says which model and why


def generated_attention_pair(pair: ModelPair) -> Union[ModelPair, str]:
    """`pair` with both models' attention by the generated kernel (runtime/decoder.py's
    `with_generated_attention`), or why it cannot be."""
    return _built_or_why(with_generated_attention, pair)
