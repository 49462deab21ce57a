"""The gateway's backends: a pool of replicas per stage (llm, vocoder, encoder), and which replica takes each call.

- Health: a replica is ready while it answers its grpc.health.v1 Check SERVING (a watcher asks each ready
  replica every `health_check_seconds`, and each other one more often), and not ready from the moment a call
  finds it unreachable until its check passes again. Calls go to ready replicas only: one that fails is
  skipped until it recovers. A vocoder's voices (ListVoices) are asked when it becomes ready, and every
  VOICES_SECONDS while it is (a voice another gateway made, or an operator's).
- Placement: the ready replica with the fewest calls in progress from this gateway, then the fewest sessions,
  then the next in turn (so equal replicas share the work). A Converse session keeps its llm replica from
  turn to turn, where its last turn's KV blocks are pinned (session.py), and moves only when that replica is
  not ready (any replica can serve any turn: it computes the history once);
  vocoder streams are placed one by one.
- Readiness: the gateway reports SERVING while llm and vocoder have a ready replica (the encoder serves spoken turns
  only: without one, typed turns go on and spoken ones fail naming it). A call that finds none waits
  for one, for at most `ready_wait` seconds and within its own deadline, instead of failing at once (a stack
  still starting, a supervisor restarting a stage); then UNAVAILABLE naming the stage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from moss.speech.v1 import encoder_pb2_grpc, llm_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc

from services.common.errors import Unavailable
from services.common.tls import ChannelTls, channel
from services.gateway import metrics
from services.gateway.settings import HEALTH_CHECK_SECONDS
from services.gateway.voice_owners import VoiceOwners

log = logging.getLogger(__name__)

# ... and at most how long between two checks of one that is not ready: a restarted stage is found ~0.1-0.3 s after it
# serves (with 0.5 s and a reconnect backoff of up to 1 s, 0.45-1.1 s of every restart on an H200: docs/benchmarks.md)
RECOVERY_CHECK_SECONDS = 0.1
CHECK_TIMEOUT = 1.0
VOICES_SECONDS = 5.0  # a ready vocoder's voices are asked again this often
# A stage that restarts is found again within a quarter second: the default backoff grows to two minutes,
# and a channel in backoff fails calls at once without trying to connect. (Loopback: a try costs nothing.)
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
]


class Replica:
    """One address of a stage: its channel, stub and health, and what this gateway has placed on it."""

    def __init__(self, stage: str, target: str, stub_class, tls: ChannelTls | None = None):
        self.stage, self.target = stage, target
        self.channel = channel(target, tls, CHANNEL_OPTIONS)
        self.stub = stub_class(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.ready = False
        self.checked = 0.0  # time.monotonic() of its last health check
        self.calls = 0     # calls in progress: turns on an llm, streams on a vocoder
        self.sessions = 0  # Converse sessions whose last turn ran here (their KV blocks pinned for the next)
        self.voices: tuple[str, ...] | None = None  # a vocoder's ListVoices (None: not known, or not a vocoder)
        self.stream_slots = 0  # a vocoder's streams at full speed (ListVoices; 0: no limit of its own, or not known)
        self.max_prompt_seconds = 0.0  # a vocoder's longest voice recording (ListVoices; 0: it makes no voices)
        self.max_voices = 0    # a vocoder's most voices, those added included (ListVoices; 0: no limit said)
        self.voices_listed = 0.0   # time.monotonic() of the ListVoices whose answer `voices` holds
        self.voices_changed = 0.0  # ... of this gateway's own last change to `voices` (a voice made or deleted)

    def __repr__(self) -> str:
        return f"{self.stage} at {self.target}"

    async def check(self) -> bool:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT)
        except grpc.aio.AioRpcError:
            return False
        serving = reply.status == health_pb2.HealthCheckResponse.SERVING
        # (again) ready, or not asked for a while: what voices does it have now? (another gateway, or an operator, may
        # have added one)
        stale = time.monotonic() - self.voices_listed >= VOICES_SECONDS
        if serving and self.stage == "vocoder" and (not self.ready or stale):
            return await self.list_voices()
        return serving

    async def list_voices(self) -> bool:
        """Ask a vocoder for its voices (ListVoices) → whether it answered. A vocoder without ListVoices checks a
        turn's voice itself (voices None)."""
        asked = time.monotonic()
        try:
            listed = await self.stub.ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=CHECK_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                return False
            self.voices, self.stream_slots, self.voices_listed = None, 0, asked
            return True
        if asked >= self.voices_changed:  # (an answer older than this gateway's own change is not taken)
            self.voices, self.stream_slots = tuple(listed.voices), listed.stream_slots
            self.max_prompt_seconds, self.max_voices = listed.max_prompt_seconds, listed.max_voices
            self.voices_listed = asked
        return True

    def add_calls(self, n: int) -> None:
        """n calls began (n > 0) or ended (n < 0) on this replica."""
        self.calls += n
        metrics.REPLICA_CALLS.labels(self.stage, self.target).set(self.calls)

    def add_sessions(self, n: int) -> None:
        self.sessions += n
        metrics.REPLICA_SESSIONS.labels(self.target).set(self.sessions)


class Pool:
    """The replicas of one stage."""

    def __init__(self, stage: str, targets: list[str], stub_class, tls: ChannelTls | None = None):
        if not targets:
            raise ValueError(f"no {stage} target")
        if len(set(targets)) != len(targets):
            raise ValueError(f"{stage} targets repeat: {', '.join(targets)}")
        self.stage = stage
        self.replicas = [Replica(stage, target, stub_class, tls) for target in targets]
        self._any_ready = asyncio.Event()
        self._turn = 0  # where ties start: equal replicas take calls in turn
        for replica in self.replicas:  # every series exported from the start, at 0
            metrics.REPLICA_READY.labels(stage, replica.target).set(0)
            metrics.REPLICA_CALLS.labels(stage, replica.target).set(0)
            if stage == "llm":
                replica.add_sessions(0)
        metrics.BACKEND_READY.labels(stage).set(0)
        metrics.REPLICA_RETRIES.labels(stage)

    @property
    def ready(self) -> bool:
        return self._any_ready.is_set()

    def set_ready(self, replica: Replica, ok: bool, why: str = "") -> None:
        if ok != replica.ready:
            log.info("gateway: %s is %s%s", replica, "ready" if ok else "NOT ready", why)
        replica.ready = ok
        metrics.REPLICA_READY.labels(self.stage, replica.target).set(int(ok))
        (self._any_ready.set if any(r.ready for r in self.replicas) else self._any_ready.clear)()
        metrics.BACKEND_READY.labels(self.stage).set(int(self.ready))

    def mark_down(self, replica: Replica, why: Exception | None = None) -> None:
        """A call found this replica unreachable (`why`: how it failed, for the log): skip it until its health check
        passes again."""
        if replica.ready:
            failed = f"a call failed ({why})" if why is not None else "a call failed"
            self.set_ready(replica, False, f"; {failed}: skipped until its health check passes")

    def pick(self, prefer: Replica | None = None) -> Replica | None:
        """`prefer` if it is ready, else the least-loaded ready replica (None: no replica is ready)."""
        if prefer is not None and prefer.ready:
            return prefer
        n = len(self.replicas)
        ready = [(r.calls, r.sessions, (i - self._turn) % n, i) for i, r in enumerate(self.replicas) if r.ready]
        if not ready:
            return None
        i = min(ready)[-1]
        self._turn = (i + 1) % n
        return self.replicas[i]

    async def wait(self, seconds: float, limit: float) -> None:
        """Until a replica is ready, for at most `seconds`; then Unavailable naming the stage (and `limit`,
        the whole wait allowed)."""
        try:
            await asyncio.wait_for(self._any_ready.wait(), max(seconds, 0.0))
        except TimeoutError:
            targets = ", ".join(r.target for r in self.replicas)
            raise Unavailable(self.stage, f"not ready (no SERVING health check from {targets} within "
                                          f"{max(limit, 0.0):.1f} s)") from None

    async def poll(self, every: float) -> None:
        """Check the replicas that are not ready, and those ready ones not checked for `every` seconds."""
        now = time.monotonic()
        due = [r for r in self.replicas if not r.ready or now - r.checked >= every]
        for replica, ok in zip(due, await asyncio.gather(*(r.check() for r in due))):
            replica.checked = now
            self.set_ready(replica, ok)

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.channel.close()


class Backends:
    def __init__(self, llm_targets: list[str], vocoder_targets: list[str], ready_wait: float,
                 tls: ChannelTls | None = None, health_check_seconds: float = HEALTH_CHECK_SECONDS,
                 encoder_targets: list[str] | None = None):
        self.llm = Pool("llm", llm_targets, llm_pb2_grpc.LlmStub, tls)
        self.vocoder = Pool("vocoder", vocoder_targets, vocoder_pb2_grpc.VocoderStub, tls)
        self.encoder = Pool("encoder", encoder_targets, encoder_pb2_grpc.EncoderStub, tls) if encoder_targets else None
        self.ready_wait, self.health_check_seconds = ready_wait, health_check_seconds
        self.voice_owners = VoiceOwners()  # who each voice made through the API is for (the gateway sets its own)

    @property
    def pools(self) -> tuple[Pool, Pool]:
        """The stages every turn needs: the gateway is SERVING while each has a ready replica."""
        return self.llm, self.vocoder

    @property
    def all_pools(self) -> tuple[Pool, ...]:
        return self.pools + ((self.encoder,) if self.encoder is not None else ())

    def voices(self, owner: str | None = None) -> tuple[str, ...] | None:
        """The voices of the ready vocoder replicas, all together (None: none has said); owner (voice_owners.owner_of):
        only those it may use."""
        known = [r.voices for r in self.vocoder.replicas if r.ready and r.voices is not None]
        names = tuple(sorted(set().union(*known))) if known else None
        return names if names is None or owner is None else self.voice_owners.usable(names, owner)

    async def voices_of(self, replica: Replica, name: str) -> tuple[str, ...] | None:
        """A vocoder replica's voices for a turn in voice `name`: asked again first when they lack a name that another
        ready replica lists or the owners' book has made (a voice made since this gateway last asked this replica:
        by another gateway, within VOICES_SECONDS). A name nobody has costs no call."""
        if (replica.voices is not None and name and name not in replica.voices
                and (name in (self.voices() or ()) or self.voice_owners.made(name))):
            await replica.list_voices()
        return replica.voices

    def stream_slots(self) -> int | None:
        """The streams the ready vocoders decode at full speed, all together; None where they set no limit (none
        ready, or one without a flow history)."""
        slots = [r.stream_slots for r in self.vocoder.replicas if r.ready]
        return sum(slots) if slots and all(slots) else None

    async def watch(self, on_change: Callable[[bool], Awaitable[None]],
                    on_slots: Callable[[int | None], None] = lambda slots: None) -> None:
        """Ask the replicas' health checks until cancelled: a ready replica every `health_check_seconds`, one that
        is not every RECOVERY_CHECK_SECONDS at most (so that one starting or back is used within a moment);
        on_change(every stage ready) whenever that flips, on_slots(stream_slots()) whenever that changes."""
        serving, slots = None, None
        while True:
            await asyncio.gather(*(pool.poll(self.health_check_seconds) for pool in self.all_pools))
            if (now_slots := self.stream_slots()) != slots:
                slots = now_slots
                on_slots(slots)
            now_serving = all(pool.ready for pool in self.pools)
            if now_serving != serving:
                serving = now_serving
                await on_change(serving)
            await asyncio.sleep(min(self.health_check_seconds, RECOVERY_CHECK_SECONDS))

    async def acquire(self, budget: float, llm: Replica | None = None) -> tuple[Replica, Replica, float]:
        """A replica of each stage for one turn (`llm`: the session's, if it is ready) → (llm, vocoder, seconds
        waited for a stage to be ready). Raises Unavailable naming a stage that had none within the wait."""
        waited = await self._wait_ready(self.pools, budget)
        return self.llm.pick(llm), self.vocoder.pick(), waited

    async def acquire_llm(self, budget: float, llm: Replica | None = None) -> Replica:
        """An llm replica for a turn that needs no vocoder (a text reply), waited for as in acquire."""
        await self._wait_ready((self.llm,), budget)
        return self.llm.pick(llm)

    async def acquire_encoder(self, budget: float) -> Replica:
        """An encoder replica for a spoken turn, waited for as in acquire; Unavailable without one."""
        if self.encoder is None:
            raise Unavailable("encoder", "this gateway has no --encoder-target")
        await self._wait_ready((self.encoder,), budget)
        return self.encoder.pick()

    async def replace(self, pool: Pool, failed: Replica, budget: float, why: Exception | None = None) -> Replica:
        """A replica of `pool` failed a call before answering it (`why`): mark it down → another ready replica, waited
        for as in acquire (the same one, once its health check passes again: a stage that restarted)."""
        pool.mark_down(failed, why)
        metrics.REPLICA_RETRIES.labels(pool.stage).inc()
        await self._wait_ready((pool,), budget)
        return pool.pick()

    async def _wait_ready(self, pools: tuple[Pool, ...], budget: float) -> float:
        """Until every pool has a ready replica, for at most `ready_wait` and `budget` seconds → seconds waited."""
        if all(pool.ready for pool in pools):
            return 0.0
        start = time.perf_counter()
        limit = min(self.ready_wait, budget)
        try:
            while not all(pool.ready for pool in pools):  # (one may fail again while another is awaited)
                for pool in pools:
                    await pool.wait(limit - (time.perf_counter() - start), limit)
        finally:
            metrics.READY_WAIT.observe(time.perf_counter() - start)
        return time.perf_counter() - start

    async def close(self) -> None:
        for pool in self.all_pools:
            await pool.close()
