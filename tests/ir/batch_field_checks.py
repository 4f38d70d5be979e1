"""A check the batch rule's IR fields share: `verify` refuses the field where it does not
belong and a value it does not know, and reading refuses JSON that gives it a non-string."""
from dataclasses import replace

import pytest

from specpilot.ir import IllFormed, IRError, program_from_json, program_to_json, verify


def assert_batch_field_checked(field: str, misplaced, value: str, placed, unknown: str) -> None:
    """`misplaced` is a Program where batch.`field` must stay at its default, `placed` one where
    it may be set (a well-formed Program)."""
    where = f"batch.{field}"
    with pytest.raises(IllFormed, match=where):
        verify(replace(misplaced, batch=replace(misplaced.batch, **{field: value})))
    with pytest.raises(IllFormed, match=where):
        verify(replace(placed, batch=replace(placed.batch, **{field: unknown})))
    text = program_to_json(placed).replace('"layout":"padded"', f'"layout":"padded","{field}":7')
    with pytest.raises(IRError, match=where):
        program_from_json(text)
