"""The GPT training check on every device present (CUDA on the device machine): 20 AdamW steps
of examples/gpt.py's model under kiln.compile match eager's losses and parameters (fp32,
dropout off), with nothing falling back."""
import copy
import os
import sys

import pytest
import torch

import kiln
from testing import assert_close

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"))
from gpt import TINY, GPT, counting_batches  # noqa: E402

DEVICES = ["cuda"] if torch.cuda.is_available() else []


def _train(model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    for x, y in data:
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.skipif(not DEVICES, reason="no CUDA device here; CPU is covered by test_gpt_training.py")
@pytest.mark.parametrize("device", DEVICES)
def test_gpt_trains_like_eager_on_device(device):
    torch.manual_seed(0)
    eager = GPT(TINY).to(device)
    model = copy.deepcopy(eager)
    data = counting_batches(20, 4, TINY, device=device)
    with kiln.config.patch(strict=True):
        got = _train(kiln.compile(model), data)
    want = _train(eager, data)
    assert want[-1] < want[0]
    assert_close(torch.tensor(got), torch.tensor(want), dtype=torch.float16)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_close(p, q, dtype=torch.float16)
    s = kiln.stats()
    assert s["fallbacks"] == 0 and s["graph_breaks"] == 0 and s["frames_compiled"] >= 1
