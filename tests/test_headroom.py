"""Admission by headroom (services/gateway/headroom.py): the limit's arithmetic on recorded signals, and a small
simulated service whose streams fall behind past a capacity the rule does not know."""

import asyncio
import dataclasses

import pytest

from services.common.errors import ResourceExhausted
from services.gateway.admission import RETRY_MAX, RETRY_MIN, Admission
from services.gateway.headroom import Headroom, HeadroomRule

RULE = HeadroomRule(initial_limit=8, min_limit=2, max_limit=64, low_slack=0.05, high_slack=0.25, slack_quantile=0.02,
                    ttfa_target=0.3, window=2.0, period=0.5, increase=2, decrease=0.9, burst_turns=0)


def test_the_limit_grows_only_while_it_holds_turns_back_and_every_stream_is_ahead():
    h = Headroom(RULE)
    h.observe_slack(0.0, 0.6)
    h.update(0.0, running=8)      # at the limit, every stream 0.6 s ahead: room
    assert h.limit == 10
    h.update(0.2, running=10)     # within the period: no decision
    assert h.limit == 10
    h.update(0.5, running=3)      # far under the limit: the limit is not what holds turns back
    assert h.limit == 10
    h.observe_slack(0.9, 0.2)     # a stream only 0.2 s ahead: no room, no alarm
    h.update(1.0, running=10)
    assert h.limit == 10
    assert not h.admits(1.2, running=10)  # refused for the limit (no decision within the period)...
    h.observe_slack(3.1, 0.6)
    h.update(3.5, running=5)              # ... and turns ended since: it held one back; room (the 0.2 s is old): it grows
    assert h.limit == 12


def test_the_slack_read_is_a_low_quantile_of_the_chunks_not_the_least():
    h = Headroom(RULE)
    for i in range(100):          # one chunk in a hundred 30 ms from a stall: under the 2% read, room
        h.observe_slack(0.0, 0.03 if i == 0 else 0.6)
    h.update(0.0, running=8)
    assert h.limit == 10 and "slack p2 600 ms" in h.last_reason
    for i in range(100):          # three in a hundred more: the 2% read is 30 ms, too many turns
        h.observe_slack(0.1, 0.03 if i < 3 else 0.6)
    h.update(0.5, running=10)
    assert h.limit == 9 and "slack p2 30 ms" in h.last_reason


@pytest.mark.parametrize("signal", ["slack", "ttfa"])
def test_a_stream_near_a_stall_or_slow_first_audio_brings_the_limit_under_what_runs(signal):
    h = Headroom(RULE)
    h.limit = 40

    def alarm(now: float) -> None:
        if signal == "slack":
            h.observe_slack(now, 0.03)                    # 30 ms from a stall
        else:
            for i in range(10):
                h.observe_ttfa(now, 0.25 if i < 9 else 0.5)  # p95 500 ms

    alarm(0.0)
    h.update(0.1, running=30)
    assert h.limit == pytest.approx(27)                # 0.9 x the 30 running
    assert ("slack p2 30 ms" if signal == "slack" else "TTFA p95 500 ms") in h.last_reason
    h.update(0.6, running=1)                           # the alarm acted once: nothing new, the limit stays
    assert h.limit == pytest.approx(27)
    alarm(0.7)                                         # the same alarm with one turn running:
    h.update(1.1, running=1)
    if signal == "slack":                              # a stream near a stall: down, at most by half at once
        assert h.limit == pytest.approx(13.5)
    else:                                              # slow first audio with one turn: a cold stack, not a full one
        assert h.limit == pytest.approx(27)


def test_first_audio_past_its_promise_at_p95_brings_the_limit_down():
    h = Headroom(RULE)
    h.observe_slack(0.0, 0.6)
    for _ in range(20):
        h.observe_ttfa(0.0, 0.28)  # p95 280 ms, within the 300 ms target: room
    h.update(0.0, running=8)
    assert h.limit == 10
    h.observe_slack(0.1, 0.6)
    for i in range(20):
        h.observe_ttfa(0.1, 0.28 if i < 16 else 0.32)  # of 40 turns, 4 at 320 ms: p95 320 ms with 4 running (under
    h.update(0.5, running=4)                            # half the limit): no room, nor a fall (a cold stack's first turns)
    assert h.limit == 10
    h.update(1.0, running=10)                           # the same window with the limit running: too many
    assert h.limit == pytest.approx(9) and "TTFA p95 320 ms" in h.last_reason == h.fall_reason


def test_with_first_audio_far_under_its_promise_the_limit_grows_in_proportion():
    """With room, the limit grows by growth x itself x (1 - TTFA p95 / target), at least by `increase`; while the window
    holds too few turns for a p95, by `increase` alone."""
    rule = dataclasses.replace(RULE, initial_limit=50, max_limit=256, growth=0.4)

    def decide(h: Headroom, now: float, ttfas: list[float]) -> float:
        before = h.limit
        h.observe_slack(now, 0.6)
        for t in ttfas:
            h.observe_ttfa(now, t)
        h.update(now, running=int(h.limit))
        return h.limit - before

    h = Headroom(rule)
    assert decide(h, 0.0, [0.15] * 20) == pytest.approx(0.4 * 50 * 0.5)  # p95 150 ms of a 300 ms target: +10
    assert decide(h, 3.0, [0.15] * 19) == 2                                # 19 turns: no p95 to trust, +2
    assert decide(h, 6.0, [0.15] * 18 + [0.29] * 2) == 2                     # p95 290 ms: 0.4 x 62 x 1/30 < 2
    slow = Headroom(dataclasses.replace(rule, growth=0.0))                 # --admit-growth 0: the additive rule
    assert decide(slow, 0.0, [0.15] * 20) == 2
    assert Headroom(rule).limit == 50 and decide(Headroom(dataclasses.replace(rule, max_limit=55)), 0.0, [0.0] * 20) == 5


def test_the_growth_is_a_flag_from_0_to_1():
    from services.cli import parser
    from services.gateway import server
    from services.gateway.settings import GatewaySettings
    from services.settings import from_args

    args = parser().parse_args(["gateway", "--admission", "headroom", "--admit-growth", "0.25"])
    assert server.headroom(from_args(GatewaySettings, args)).rule.growth == 0.25
    for bad in ("1.5", "-0.1", "x"):
        with pytest.raises(SystemExit) as info:
            parser().parse_args(["gateway", "--admit-growth", bad])
        assert info.value.code == 2


def test_old_signals_leave_the_window_once_a_decision_has_read_them():
    h = Headroom(RULE)
    h.observe_slack(0.0, -0.2)   # a stall, read at once
    h.update(0.1, running=8)
    assert h.limit == pytest.approx(7.2)
    h.observe_slack(2.9, 0.5)
    h.update(3.0, running=8)
    assert h.limit == pytest.approx(9.2)  # the stall is out of the 2 s window and was read: room again


def test_a_stall_between_arrivals_far_apart_is_read_by_the_next_decision():
    """A burst's turns stall while nothing arrives; the next arrival, seconds later, still lowers the limit (the turns
    running then: none, so by max_fall), where the window alone had forgotten the stall."""
    h = Headroom(RULE)
    h.update(0.0, running=8)                 # the burst's last arrival
    h.observe_slack(1.0, -0.3)               # its turns stall
    h.observe_slack(4.0, 0.4)                # and end
    h.update(12.0, running=0)                # the next arrival
    assert h.limit == pytest.approx(4.0) and h.fall_reason.startswith("slack")
    h.update(12.6, running=0)                # read once
    assert h.limit == pytest.approx(4.0)


def test_the_limit_finds_a_capacity_it_is_not_told():
    """A service that keeps its streams 0.5 s ahead up to 40 turns, and falls behind in proportion past them;
    turns arrive faster than it can serve, and the limit starts far over the capacity. It comes down, and settles
    around 40."""
    capacity, h, running, limits = 40, Headroom(dataclasses.replace(RULE, initial_limit=64)), 0, []
    for step in range(600):  # 60 s in steps of 0.1 s
        now = step * 0.1
        for _ in range(5):   # 50 turns a second offered; each runs 6 s (60 steps)
            if h.admits(now, running):
                running += 1
        running = max(0, running - running // 60)  # turns end at their pace
        slack = 0.5 if running <= capacity else 0.5 - 0.1 * (running - capacity)
        h.observe_slack(now, slack)
        if step >= 300:
            limits.append(h.limit)
    assert 0.75 * capacity <= min(limits) and max(limits) <= capacity + 3 * RULE.increase


@pytest.mark.parametrize("growth", [0.0, 0.4])
def test_with_first_audio_far_under_its_promise_the_limit_reaches_a_large_capacity_in_seconds(growth):
    """A service with room for 160 turns, its first audio 100-200 ms (a 300 ms target), its streams falling behind
    past 160; 80 turns a second offered, each running 3 s, from a limit of 48. Grown in proportion to TTFA's room, the
    limit passes 120 within 4 s and settles near 160; grown by 2 a decision, it takes over 15 s. (Turns end between
    arrivals: the limit counts as holding turns back when it refused one since the last decision.)"""
    capacity = 160
    h, running, limits = Headroom(dataclasses.replace(RULE, initial_limit=48, max_limit=256, growth=growth)), 0, []
    for step in range(600):  # 60 s in steps of 0.1 s
        now = step * 0.1
        for _ in range(8):
            if h.admits(now, running):
                running += 1
                h.observe_ttfa(now, 0.1 + 0.1 * running / capacity)
        running -= running // 30
        h.observe_slack(now, 0.5 if running <= capacity else 0.5 - 0.1 * (running - capacity))
        limits.append(h.limit)
    reached = next(step for step, limit in enumerate(limits) if limit >= 0.75 * capacity) * 0.1
    assert (reached <= 4) if growth else (reached > 15), reached
    assert 0.9 * capacity <= min(limits[300:]) and max(limits[300:]) <= 1.1 * capacity


def test_a_burst_on_an_idle_stack_runs_up_to_its_own_cap_over_the_limit_and_only_within_its_window():
    h = Headroom(dataclasses.replace(RULE, burst_turns=20, burst_window=0.25))  # the limit: 8
    admitted = [h.admits(10.0 + i * 0.001, running=i) for i in range(24)]  # 24 at once on an idle stack
    assert admitted == [True] * 20 + [False] * 4 and h.limit == 8   # 20 run: 12 over the limit; it is unchanged
    assert h.admits(10.2, running=19) and h.over_limit              # a place freed within the window: taken
    assert not h.admits(10.3, running=19) and not h.over_limit      # past the window: the limit holds them back
    assert h.admits(10.3, running=7) and not h.over_limit           # under the limit: as ever
    # a stack that is not idle opens no window: turns arriving at once beside one running meet the limit
    busy = Headroom(dataclasses.replace(RULE, burst_turns=20))
    assert [busy.admits(20.0, running=i) for i in range(1, 10)] == [True] * 7 + [False] * 2
    # and none at all with --admit-burst-turns 0
    off = Headroom(RULE)
    assert [off.admits(30.0, running=i) for i in range(10)] == [True] * 8 + [False] * 2


def test_while_a_burst_drains_an_ongoing_sessions_next_turn_may_run_up_to_its_cap_a_new_session_may_not():
    h = Headroom(dataclasses.replace(RULE, burst_turns=20, burst_window=0.25))  # the limit: 8
    assert all(h.admits(10.0, running=i) for i in range(20))                    # a burst: 20 run, 12 over the limit
    assert not h.admits(12.0, running=15)                                       # past its window a new one meets the limit
    assert h.admits(12.0, running=15, reserve=0.1, ongoing=True) and h.over_limit  # a session's next turn still runs
    assert not h.admits(12.1, running=20, reserve=0.1, ongoing=True)            # up to the burst's cap
    assert h.admits(13.0, running=7) and not h.over_limit                       # under the limit again: drained
    assert not h.admits(13.1, running=9, reserve=0.1, ongoing=True)             # from then on the reserve alone (8 x 1.1)
    # no burst, no drain: a limit that fell under the turns running leaves an ongoing turn the reserve alone
    fallen = Headroom(dataclasses.replace(RULE, burst_turns=20))
    assert not fallen.admits(20.0, running=12, reserve=0.1, ongoing=True)


def test_arrivals_spread_out_meet_the_limit_from_an_idle_start():
    """90 turns a second (three times the limit's capacity here) from an idle stack: the window of the first arrival
    holds ~22 of them, under the limit, so the burst lets none in over it: the start is the rule's, as without it."""
    def admitted_over(burst_turns):
        h = Headroom(dataclasses.replace(RULE, initial_limit=48, max_limit=256, burst_turns=burst_turns))
        ends, over, admitted = [], 0, 0  # the running turns' ends
        for k in range(900):  # 10 s at 90 a second; each turn runs 3 s
            now = k / 90
            ends = [end for end in ends if end > now]
            if h.admits(now, len(ends)):
                ends.append(now + 3.0)
                over += h.over_limit
                admitted += 1
        return over, admitted, h.limit

    assert admitted_over(128) == admitted_over(0) and admitted_over(128)[0] == 0


def test_a_refusal_past_a_burst_hints_at_the_turns_that_must_end_before_the_limit_admits_again():
    async def scenario():
        rule = HeadroomRule(initial_limit=4, min_limit=1, burst_turns=12, burst_window=60)
        adm = Admission(max_turns=16, max_queued=0, headroom=Headroom(rule))
        adm.recent.extend([2.0] * 8)  # turns lately held their places 2 s
        hold = asyncio.Event()

        async def turn():
            async with adm.turn(None):
                await hold.wait()

        held = [asyncio.create_task(turn()) for _ in range(12)]  # a burst on an idle stack: 12 in, 8 over the limit
        await asyncio.sleep(0)
        assert adm.running == 12
        with pytest.raises(ResourceExhausted) as in_window:
            await turn()  # at the burst's cap; the hint is reckoned against the limit, which holds after the window
        adm.headroom.burst_until = 0.0  # the window has passed
        with pytest.raises(ResourceExhausted) as past:
            await turn()
        # past the window, 9 of the 12 must end before the limit of 4 lets one in: 9/12 of a turn's 2 s
        assert past.value.retry_after == pytest.approx(2.0 * 9 / 12)
        assert in_window.value.retry_after == pytest.approx(2.0 * 9 / 12)
        hold.set()
        await asyncio.gather(*held)

    asyncio.run(scenario())


def test_admission_refuses_at_once_past_the_limit_with_a_hint():
    async def scenario():
        rule = HeadroomRule(initial_limit=2, min_limit=1, burst_turns=0)
        adm = Admission(max_turns=16, max_queued=16, headroom=Headroom(rule))
        hold = asyncio.Event()

        async def turn():
            async with adm.turn(None):
                await hold.wait()

        held = [asyncio.create_task(turn()) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhausted, match=r"no headroom: 2 turns playing") as info:
            await turn()  # refused, not queued, though --max-turns has room
        assert RETRY_MIN <= info.value.retry_after <= RETRY_MAX and not adm.waiting
        hold.set()
        await asyncio.gather(*held)
        assert adm.running == 0

    asyncio.run(scenario())


def _bench_through_own_gateway(stack, tmp_path, gateway_flags, concurrency, requests, tokens):
    """`moss-serve bench` of `requests` turns, `concurrency` at once, through a gateway of its own in front of the
    stand-in stack (conftest.py: it keeps the admitted streams in real time on a 2-core CPU, which these tests of the
    rule's promise need; admitting by headroom with `gateway_flags`) → (its level in bench.json, the gateway's metrics after
    it, what the stages still hold)."""
    import json
    import subprocess
    import sys

    from conftest import left_held, own_gateway, scrape

    with own_gateway(stack, tmp_path, "--admission", "headroom", "--admit-ttfa", "5", "--max-turns", "8",
                     *gateway_flags) as gateway:
        proc = subprocess.run([sys.executable, "-m", "services.cli", "bench", "--no-progress", "--target",
                               gateway.target, "--concurrency", str(concurrency), "--requests", str(requests),
                               "--max-new-tokens", str(tokens), "--warmup", "0", "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=240)
        text = scrape(gateway.metrics)
        held = left_held(gateway, stack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / "bench.json").read_text())["levels"][str(concurrency)], text, held


def test_past_its_headroom_the_gateway_refuses_at_once_and_keeps_the_admitted_on_time(stand_in_stack, tmp_path):
    """More streams offered than the limit: the admitted play on time, the rest are refused at once with a hint,
    and nothing is left held."""
    from conftest import metric_value

    # admitting from 2 turns, its least limit too (it learns more only from streams playing ahead), without a burst's
    # allowance (the next test's)
    level, text, held = _bench_through_own_gateway(stand_in_stack, tmp_path, ["--admit-initial-turns", "2",
                                                                      "--admit-burst-turns", "0"], 6, 12, 20)
    s, streams = level["summary"], level["streams"]
    assert s["refused"] >= 1 and s["ok"] >= 2 and s["ok"] + s["refused"] == 12
    assert s["refusals_with_hint"] == s["refused"] and s["refusal_seconds"]["max"] < 1.0
    assert all("no headroom" in x["error"] for x in streams if x["code"] == "RESOURCE_EXHAUSTED")
    assert s["stall_free_share"] == 1.0  # every admitted stream played on time
    assert metric_value(text, "gateway_headroom_refusals_total") == s["refused"]
    assert 2 <= metric_value(text, "gateway_admission_limit") <= 8
    # every chunk after a stream's first went into the slack histogram
    chunks = sum(len(x["chunk_samples"]) - 1 for x in streams if x["code"] == "OK")
    assert chunks > 0 and metric_value(text, "gateway_playback_slack_seconds_count") == chunks
    assert not any(held.values())


def test_a_burst_on_an_idle_gateway_is_let_in_up_to_its_cap_and_plays_on_time(stand_in_stack, tmp_path):
    """8 turns sent at the same instant to an idle gateway whose limit is 2 (started there, its least) and whose burst
    may run 6: 6 play, on time, 4 of them over the limit; 2 are refused at once with a hint; nothing is left held."""
    from conftest import metric_value

    # (a window of 5 s: the 8 calls arrive within it however slow the machine, and the 6 turns outlast them)
    level, text, held = _bench_through_own_gateway(stand_in_stack, tmp_path, ["--admit-initial-turns", "2", "--admit-burst-turns",
                                                                      "6", "--admit-burst-window", "5"], 8, 8, 80)
    s, streams = level["summary"], level["streams"]
    assert (s["ok"], s["refused"]) == (6, 2), s
    assert s["refusals_with_hint"] == 2 and all("no headroom" in x["error"] for x in streams
                                                if x["code"] == "RESOURCE_EXHAUSTED")
    assert s["stall_free_share"] == 1.0
    assert metric_value(text, "gateway_burst_admissions_total") == 4
    assert metric_value(text, "gateway_headroom_refusals_total") == 2
    assert metric_value(text, "gateway_admission_limit") == 2  # the burst did not move the limit
    assert not any(held.values())


def test_the_gateway_says_at_start_what_it_admits_by():
    """`moss-serve up` chooses --max-turns on a GPU (the vocoders' history slots): the gateway's first lines say it."""
    from services.cli import parser
    from services.gateway import server
    from services.gateway.settings import GatewaySettings
    from services.settings import from_args

    given = from_args(GatewaySettings, parser().parse_args(
        ["gateway", "--admission", "headroom", "--max-turns", "128", "--max-starting-turns", "16"]))
    line = server.admission_line(given, per_client=64)
    initial = min(HeadroomRule.initial_limit, 128)
    assert line == (f"admission by headroom, from {initial} turns; at most 128 turns running (--max-turns), "
                    f"{given.max_queued_turns} waiting, 16 starting, 64 per client (an API key, else an address "
                    f"other than this host's)")
    bare = from_args(GatewaySettings, parser().parse_args(["gateway"]))
    assert server.per_client_limit(bare, keyed=True) == 128 and server.per_client_limit(bare, keyed=False) == 32
    assert server.per_client_limit(given, keyed=False) == 16
    none = from_args(GatewaySettings, parser().parse_args(["gateway", "--max-turns-per-client", "0"]))
    assert server.per_client_limit(none, keyed=False) == 0
    assert server.admission_line(none, per_client=0).startswith("admission by count; at most 256 turns running")
    assert "no limit of its own per client" in server.admission_line(none, per_client=0)


def test_a_burst_of_96_on_the_embedded_default_admits_what_a_cpu_plays(stack, tmp_path):
    """96 turns at the same instant through a gateway admitting as `moss-serve up` has it admit on a CPU (headroom,
    starting at and bursting to a turn per two cores), in front of the embedded default (the codec's flow + HiFT on the
    CPU): a few are admitted and play on time, the rest are refused at once with a retry hint, nothing is left held.
    (The issue's 50 ms for the refusals depends on the 2-core machine: p95 29-36 ms on one, 80-133 ms on a slower one,
    docs/admission.md; asserted here within 1 s.)"""
    import json
    import os
    import subprocess
    import sys

    from conftest import left_held, own_gateway

    from services.cli import parser
    from services.up import cpu_turns, up_service_args

    flags = up_service_args(parser().parse_args(["up"]))["gateway"]
    assert "headroom" in flags
    with own_gateway(stack, tmp_path, *flags) as gateway:
        proc = subprocess.run([sys.executable, "-m", "services.cli", "bench", "--no-progress", "--target", gateway.target,
                               "--concurrency", "96", "--requests", "96", "--max-new-tokens", "40", "--warmup", "0",
                               "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
        held = left_held(gateway, stack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "bench.json").read_text())["levels"]["96"]["summary"]
    assert 1 <= s["ok"] <= cpu_turns() == max(1, len(os.sched_getaffinity(0)) // 2) and s["ok"] + s["refused"] == 96, s
    assert s["stall_free_share"] >= 0.9, s
    assert s["refusals_with_hint"] == s["refused"] and s["refusal_seconds"]["max"] < 1.0, s
    assert not any(held.values())
