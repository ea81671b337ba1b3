import os

import torch

# Without a GPU, Helion kernels run through the Triton interpreter (set before helion imports).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (H100/H200); run on the GPU machine, see README")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A freshly seeded generator per test: fresh inputs, reproducible on failure."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
