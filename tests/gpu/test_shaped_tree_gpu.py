"""The shaped-tree bench systems graphed on a CUDA GPU (the bench's `mech:graphed_sequoia` and
`mech:graphed_sequoia_timed`): the shapes priced by the calibrated cost model or by timed probe
rounds, the rounds captured for the tree chosen, exact against greedy AR in float32, forcing
clean, and each round accepting what the tree's replay says. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, noisy_checkpoint
from shaped_tree_check import assert_runs_its_tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("pricing", ["calibrated", "timed"])
def test_the_graphed_system_runs_the_tree_it_chose_exactly(tmp_path, pricing):
    target = make_checkpoint(tmp_path, "llama3", name="target", seed=71, hidden_size=64,
                             intermediate_size=128)
    drafter = noisy_checkpoint(target, "drafter", noise=0.3, seed=72)
    assert_runs_its_tree(target, drafter, "cuda", graphed=True, pricing=pricing)
