"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny shapes run faster and far steadier on a shared 2-core box on one thread (restored after the module)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
