"""Admission by headroom (`--admission headroom`): how many turns the stages can serve in time, learned from what the
gateway sees of the turns it serves, so that past the knee it refuses the excess instead of letting every listener
stall.

Two signals, both at the gateway, on the listener's clock (services/common/playback.py):
- slack: how early each chunk of a playing stream leaves the gateway, before its listener would run out of audio
  (the llm paces itself to 1.5 s of audio ahead on CUDA). When the vocoder or the llm falls behind, slack shrinks
  before any stall;
- time to first audio of the turns that started lately: the other half of what an admitted stream is promised. It
  counts from the turn's admission (pipeline.Turn.admitted_at): a wait for a place or a start slot is the gateway's
  queue, which the limit itself sets, not the stages' answer to more turns. A wait for a stage that was not ready
  (starting, restarting after a crash) is left out too: after a vocoder's restart under load, the turns that had waited
  through it brought first audio of ~6 s at p95 and cut the limit as if the stages were slow (2026-11-29).

The rule, an additive-increase / multiplicative-decrease limit on the turns running at once (as TCP's window, or the
adaptive concurrency limits of RPC servers), decided with an arrival at most every `period` seconds, from the last
`window` seconds and whatever came since the decision before. (Why the latter: decisions come with arrivals, and
bursts far apart, their turns stalling while nothing arrived, once had their stalls age out of the window unread. On a
2-core CPU stack three bursts of 96 in a row admitted 4, 6 and 8 turns, the limit only growing, and the last two
played 0% stall-free: docs/benchmarks.md, 2026-11-29.)
- the `slack_quantile` of the chunks' slack under `low_slack`, or the `ttfa_quantile` of the turns' TTFA over
  `ttfa_target` with at least half the limit running: the limit falls to `decrease` x the turns running (never under
  `min_limit`, nor under `max_fall` x the limit in one decision): what runs now is already more than the stages carry.
  The signals read are then dropped, so that each acts once. (A cold stack's first turns are slow with one turn
  running: the limit stays.);
- else, while the limit holds turns back (it refused one since the last decision, or the turns running are near it),
  and streams are playing with that quantile of slack over `high_slack`: the limit grows by `increase`, or, when the
  window holds enough turns for its TTFA quantile to mean something, by `growth` x the limit x (1 - TTFA /
  `ttfa_target`) if that is more (TTFA is then within its target: near the limit, over it is a fall);
- a turn is admitted while fewer than the limit run; otherwise RESOURCE_EXHAUSTED, at once, with a retry hint;
- except in a burst on an idle stack: a turn that arrives with none running opens a window of `burst_window` seconds
  in which up to `burst_turns` may run, over the limit; and until the turns running have fallen under the limit
  again, an ongoing session's next turn may run up to `burst_turns` too.

Why a burst on an idle stack is let in over the limit (`--admit-burst-turns`): the limit is what the stages serve in
time under sustained arrivals, and before any signal it is a guess (48, an H100's). 128 turns sent at the same instant
to an idle stack met it: 80 refused while both stages idled. Let in, the same 128 played 100% stall-free, the start
limit (admission.py's max_starting) starting them 16 at a time: on an H200 under this rule in eight runs of nine (one
93.8%: a few second chunks late), on an H100 under count admission (docs/benchmarks.md, 2026-11-28 and
2026-11-26). Their first audio came later than the promise (p95 ~2.3 s at the client, most of it the wait to start):
the price of serving them all. A sustained overload is not let in by it: its arrivals come spread out (90 a second,
three times an H100's knee, bring ~22 in a window of 0.25 s, under the limit anyway; at Poisson 30 and on a ramp of
256 it let none in), and once the window has passed every new turn meets the limit, which turns running over it hold
back until they end. Sessions started in the burst keep their places meanwhile: their next turns (a Converse
session's turn after the first) still run up to `burst_turns` while the burst drains. Without that, 15 of 128 two-turn
sessions started at once had their second turn refused, twice, in the seconds after their first reply; with it, none,
twice, all 256 turns stall-free (docs/benchmarks.md, 2026-11-28).

A low quantile, not the least slack: a stream's chunks grow (4, 5, 10, then 20 tokens), and the chunk that completes a
large one leaves the gateway only ~0.1-0.2 s before it is due even on an idle H100 (docs/benchmarks.md), so
the least of a few hundred chunks says little. A stall-free stream needs every chunk on time, so the quantile is low.
TTFA's target is the promise itself (p95 <= 300 ms) less a margin: more turns at once make every stage's
share of first audio longer (the llm's steps, the vocoder's calls that a first chunk waits for), and on an H100, at
the 40-60 turns where the slack alone held the limit, first audio came at p95 ~340 ms. A 2 s window holds a few
dozen turns, so its p95 is rough: a 0.3 s target gave 294-310 ms over whole loads, 0.28 s gave 280-299 ms
(docs/benchmarks.md).

Why a growth in proportion to TTFA's distance from its target (opt-in, `--admit-growth`): on a stack with room (a
cheaper flow, an H200) the turns' TTFA stays far under the target while the limit holds them back, and a fixed +2 a
half second refused 56-108 of 600 turns at Poisson 30 and 44 of a ramp of 256 that TTFA said could run
(docs/benchmarks.md, 2026-11-27). Near the knee TTFA is near its target, the step shrinks to `increase`, and the fall
stays what it was. Simulated in tests/test_headroom.py; measured on an H100 at 0.4 (docs/benchmarks.md, 2026-11-28):
with the opt-in trades 589 of 600 admitted at Poisson 30 against 550, but at the defaults within ±3% there and 1-14
fewer of a ramp of 256 (its larger steps overshoot, and its falls start from higher). So it is off by default.
Pure arithmetic on recorded signals: no clock of its own (every call takes `now`), nothing of asyncio or grpc.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass

# Signals kept at most, of each kind: the window's at 128 streams are ~1,300 chunks; a long quiet spell (no arrival, so
# no decision) keeps the latest.
SIGNALS_KEPT = 8192


@dataclass(frozen=True)
class HeadroomRule:
    initial_limit: int = 48        # turns at once before any signal (--admit-initial-turns): an H100's, measured
    min_limit: int = 4             # the limit never falls under this
    max_limit: int = 256           # nor grows over --max-turns
    low_slack: float = 0.05        # seconds: the quantile this close to a stall means too many turns (--admit-low-slack)
    high_slack: float = 0.1        # seconds: the quantile this far ahead means room for more
    slack_quantile: float = 0.02   # of the window's chunks (a stall-free stream needs every chunk on time)
    ttfa_target: float = 0.28      # seconds: the latest turns' TTFA quantile over this means too many (--admit-ttfa)
    ttfa_quantile: float = 0.95
    window: float = 2.0            # seconds of signals each decision reads
    period: float = 0.5            # seconds between decisions
    increase: int = 2              # turns added to the limit per decision with room, at least...
    growth: float = 0.0            # ... and this share of the limit x (1 - TTFA / ttfa_target) (--admit-growth)
    decrease: float = 0.9          # the limit after a decision without room, as a share of the turns running...
    max_fall: float = 0.5          # ... but never under this share of the limit before it
    burst_turns: int = 128         # turns a burst on an idle stack may run at once, over the limit (--admit-burst-turns)
    burst_window: float = 0.25     # seconds after a turn arrives at an idle stack that its burst lasts


class Headroom:
    def __init__(self, rule: HeadroomRule = HeadroomRule()):
        self.rule = self.given = rule
        self.limit = float(min(max(rule.initial_limit, rule.min_limit), rule.max_limit))
        # (when, seconds early) / (when, seconds), the latest SIGNALS_KEPT each
        self.slack: collections.deque[tuple[float, float]] = collections.deque(maxlen=SIGNALS_KEPT)
        self.ttfa: collections.deque[tuple[float, float]] = collections.deque(maxlen=SIGNALS_KEPT)
        self.decided = -math.inf
        self.last_reason = "no signal yet"
        self.fall_reason = "none yet"  # the latest decision that lowered the limit
        self.held_back = False  # a turn was refused for the limit since the last decision
        self.burst_until = -math.inf  # the end of the window a turn arriving at an idle stack opened
        self.over_limit = False  # the last turn asked about (admits) was let in over the limit, as part of a burst
        self.draining = False  # a burst let turns in over the limit, and the turns running have not fallen under it

    def cap(self, most: int) -> None:
        """At most `most` turns at once, a burst's too (the vocoders' stream slots: Admission.cap_turns); the rule as
        given where `most` is over it."""
        g = self.given
        self.rule = dataclasses.replace(g, max_limit=min(g.max_limit, most), burst_turns=min(g.burst_turns, most),
                                        min_limit=min(g.min_limit, most))
        self.limit = min(max(self.limit, self.rule.min_limit), self.rule.max_limit)

    def observe_slack(self, now: float, slack: float) -> None:
        """A playing stream's chunk left the gateway `slack` seconds before its listener needed it (< 0: late)."""
        self.slack.append((now, slack))

    def observe_ttfa(self, now: float, seconds: float) -> None:
        self.ttfa.append((now, seconds))

    def update(self, now: float, running: int) -> None:
        """Decide the limit again, at most every `period` seconds."""
        if now - self.decided < self.rule.period:
            return
        # The last `window` seconds, and whatever came since the last decision: a stall between two arrivals far apart
        # (a burst's turns playing, nothing arriving) is still read by the next one.
        read, self.decided = self.decided, now
        for signal in (self.slack, self.ttfa):
            while signal and signal[0][0] < now - self.rule.window and signal[0][0] <= read:
                signal.popleft()
        slack = _quantile([s for _, s in self.slack], self.rule.slack_quantile, empty=math.inf)
        r = self.rule
        ttfa = _quantile([t for _, t in self.ttfa], r.ttfa_quantile, empty=-math.inf)
        slow_starts = ttfa > r.ttfa_target and running >= self.limit / 2  # (with few running: a cold stack)
        # The limit holds turns back: it refused one since the last decision, or the turns running are near it (a
        # decision comes with an arrival, and turns that ended since the last refusal leave a few places free).
        held_back, self.held_back = self.held_back or running >= self.limit - r.increase, False
        if slack < r.low_slack or slow_starts:
            self.limit = max(r.min_limit, min(self.limit, r.decrease * running), r.max_fall * self.limit)
            self.last_reason = (f"slack p{r.slack_quantile * 100:g} {slack * 1e3:.0f} ms" if slack < r.low_slack
                                else f"TTFA p{r.ttfa_quantile * 100:g} {ttfa * 1e3:.0f} ms")
            self.fall_reason = self.last_reason
            self.slack.clear()  # each signal acts once: what follows shows whether the fall was enough
            self.ttfa.clear()
        elif held_back and self.slack and slack > r.high_slack:  # (room seen, not assumed)
            self.limit = min(r.max_limit, self.limit + max(r.increase, self._growth(ttfa)))
            self.last_reason = f"room: slack p{r.slack_quantile * 100:g} {slack * 1e3:.0f} ms"

    def _growth(self, ttfa: float) -> float:
        """Turns to add for TTFA's distance under its target, 0 while the window holds too few turns to place its
        quantile (a p95 needs 20)."""
        r = self.rule
        if len(self.ttfa) * (1 - r.ttfa_quantile) < 1:
            return 0.0
        return r.growth * self.limit * max(0.0, 1 - ttfa / r.ttfa_target)

    def admits(self, now: float, running: int, reserve: float = 0.0, ongoing: bool = False) -> bool:
        """May one more turn start, with `running` turns running? reserve: a share of the limit this turn may go
        over; ongoing: the turn is an ongoing session's (both: admission.py)."""
        self.update(now, running)
        if running == 0:  # an idle stack: a burst may start with this turn
            self.burst_until = now + self.rule.burst_window
        if running < self.limit:
            self.draining = False
        within_limit = running < int(self.limit * (1 + reserve))
        in_burst = now < self.burst_until or (ongoing and self.draining)
        self.over_limit = not within_limit and in_burst and running < self.rule.burst_turns
        self.draining |= self.over_limit
        admitted = within_limit or self.over_limit
        self.held_back |= not admitted
        return admitted


def _quantile(values: list[float], q: float, empty: float) -> float:
    """The q-quantile (nearest rank, from above); `empty` for no values (no signal: no objection)."""
    if not values:
        return empty
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]
