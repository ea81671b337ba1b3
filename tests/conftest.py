import os

import torch

# Without a GPU, Helion kernels run through the Triton interpreter (set before helion imports).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


# The inner-loop tier (`bash scripts/test.sh -m quick`): everything but the files and tests below, which compile
# kernels for sm_90 with ptxas (test_bench.py: ~10 minutes on 2 cores), run whole scripts or sweep every byte through
# the interpreter (20-30 s each). CI runs them all.
NOT_QUICK_FILES = {"test_bench.py", "test_examples.py", "test_model.py"}
NOT_QUICK_TESTS = {"test_every_byte_and_scale_cpu", "test_kernel_codes_equal_the_reference_cpu", "test_k_slices_options", "test_split_fills_the_last_wave"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name not in NOT_QUICK_FILES and item.originalname not in NOT_QUICK_TESTS and "slow" not in item.keywords:
            item.add_marker(pytest.mark.quick)
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
