"""The llm's share of the GPU following the load (services/llm/engine/gpu_share.py): the rule that picks a step's
place, the refusals where no share can be made, and on CUDA the same tokens whichever place each step ran in."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sessions import Sessions

from forcing import CFG, converse, make_engine
from services.llm.engine.gpu_share import SHARE, WHOLE, GpuShare, ShareRule
from services.llm.model.checkpoint import random_model
from services.llm.server import build_engine
from services.llm.settings import LlmSettings

CUDA = torch.cuda.is_available()


def test_the_whole_gpu_while_few_ran_lately_and_the_share_until_a_quiet_spell_after_more():
    rule = ShareRule(whole_gpu_turns=2, quiet_seconds=2.0)
    assert [rule.place(n, t) for n, t in ((0, 0.0), (1, 0.1), (2, 0.2))] == [WHOLE] * 3
    assert rule.place(3, 1.0) == SHARE            # more than 2 running: busy from here
    assert rule.place(1, 1.5) == SHARE            # few again, but the vocoder still has the busy spell's audio
    assert rule.place(2, 2.99) == SHARE
    assert rule.place(2, 3.0) == WHOLE            # 2 s after the last busy step
    assert rule.place(5, 3.1) == SHARE and rule.place(0, 5.0) == SHARE and rule.place(0, 5.1) == WHOLE


def test_no_turns_at_all_for_the_whole_gpu_means_every_step_on_the_share():
    rule = ShareRule(whole_gpu_turns=0)
    assert rule.place(1, 0.0) == SHARE and rule.place(1, 100.0) == SHARE


def test_without_a_quiet_spell_the_place_follows_each_step():
    rule = ShareRule(whole_gpu_turns=1, quiet_seconds=0.0)
    assert [rule.place(n, 1.0) for n in (1, 2, 1, 3, 0)] == [WHOLE, SHARE, WHOLE, SHARE, WHOLE]


def test_a_share_is_refused_off_a_gpu_and_for_a_runner_without_graphs():
    with pytest.raises(ValueError, match="--busy-share 25: a percentage, 1 to 100, of a GPU's multiprocessors"):
        build_engine(LlmSettings(device="cpu", busy_share=25))
    with pytest.raises(ValueError, match="--busy-share 101"):
        build_engine(LlmSettings(device="cuda", busy_share=101))

    from services.common import green_context

    no_driver = "no CUDA driver library: libcuda.so.1: cannot open shared object file"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(green_context, "unavailable", lambda: no_driver)
        with pytest.raises(ValueError, match="--busy-share 25 needs CUDA green contexts: no CUDA driver library.*"
                                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 under MPS instead"):
            build_engine(LlmSettings(device="cuda", busy_share=25))

    class Reference:  # the reference runner: no CUDA graphs to capture for a second place
        pass

    with pytest.raises(ValueError, match="needs the kernel runner with CUDA graphs on CUDA"):
        GpuShare(Reference(), 25, 2, torch.device("cpu"))


@pytest.mark.skipif(not CUDA, reason="green contexts are CUDA's")
def test_steps_moving_between_the_whole_gpu_and_the_share_give_the_tokens_of_the_whole_gpu():
    """Sessions batched together (forcing.py: mode switches, stops, steps launched ahead), each step where the rule
    puts it: more than one running goes to the share, and with no quiet spell back as soon as one runs."""
    model = random_model(CFG, device="cuda", dtype=torch.float32, seed=21)
    whole = converse(make_engine(model, "kernels"))
    engine = make_engine(model, "kernels", busy_share=25, whole_gpu_turns=1)
    share = engine.share
    assert share.green.sm_count < share.green.device_sms
    assert set(share.runner.graph_sets) == {WHOLE, SHARE}
    share.rule.quiet_seconds = 0.0
    sessions = Sessions()
    assert converse(engine, sessions=sessions) == whole
    assert share.steps[WHOLE] > 0 and share.steps[SHARE] > 0
    sessions.release_all(engine)
    assert engine.block_manager.num_used == 0 and not engine.has_work()


@pytest.mark.skipif(not CUDA, reason="green contexts are CUDA's")
def test_every_step_on_the_share_gives_the_tokens_of_the_whole_gpu():
    model = random_model(CFG, device="cuda", dtype=torch.float32, seed=21)
    whole = converse(make_engine(model, "kernels"))
    engine = make_engine(model, "kernels", busy_share=25, whole_gpu_turns=0)
    assert converse(engine) == whole
    assert engine.share.steps[WHOLE] == 0 and engine.share.steps[SHARE] > 0
