"""The GPU services' start-up check of matrix products (services/common/matmul_check.py), on the CPU: right products
pass, and a library that gets some wrong, as cuBLAS did under some MPS shares of an H100, is refused by name."""

import pytest
import torch

from services.common.matmul_check import MatmulFault, check_matmul

SMALL = ((64, 32), (32, 96))


def test_right_products_pass():
    assert check_matmul("cpu", shapes=SMALL, rows=(1, 7, 33), dtype=torch.float32) == 6


@pytest.mark.parametrize("fault", ["nan", "off"])
def test_wrong_products_are_refused_naming_the_first(monkeypatch, fault):
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "45")

    def linear(x, w):  # right, except at 7 rows into 96 outputs
        y = torch.nn.functional.linear(x, w)
        if x.shape[0] == 7 and w.shape[0] == 96:
            return torch.full_like(y, float("nan")) if fault == "nan" else 1.3 * y
        return y

    with pytest.raises(MatmulFault) as err:
        check_matmul("cpu", shapes=SMALL, rows=(1, 7, 33), linear=linear, dtype=torch.float32)
    message = str(err.value)
    assert "1 of 6" in message and "[7 x 32] @ [32 x 96]" in message
    assert ("inf off" if fault == "nan" else "0.3 off") in message
    assert isinstance(err.value, ValueError)  # `moss-serve llm|vocoder|encoder` prints it and exits 2 ("cannot start")
