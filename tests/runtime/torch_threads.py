"""One torch intra-op thread while a test module runs: at the suite's tiny shapes thread
hand-offs cost more than they save, and on a loaded machine spinning threads made single tests
many times slower. Modules use it as `one_thread = single_thread_fixture()` (autouse)."""
import pytest
import torch


def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def single_thread_fixture():
    """An autouse, module-scoped fixture running the module on one torch thread."""
    return pytest.fixture(autouse=True, scope="module")(_single_thread)
