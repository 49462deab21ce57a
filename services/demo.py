"""`make demo`: start the stack on its embedded default (the tiny llm and the codec's own decoder small, flow +
HiFT: the tiny-codec preset; RANDOM weights), speak one sentence into a WAV file, print per-stage latencies, stop
the stack."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile

from moss.speech.v1 import common_pb2

from services.common.audio import write_wav
from services.gateway.client import print_timings, synthesize
from services.stack import Ports, Stack

SENTENCE = "Hello! Could you tell me what the weather will be like tomorrow?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="demo.wav")
    p.add_argument("--text", default=SENTENCE)
    p.add_argument("--max-new-tokens", type=int, default=75, help="75 tokens = 6 s of audio")
    p.add_argument("--device", default="cpu", help="cpu or cuda, for the llm and the vocoder")
    args = p.parse_args()
    logs = tempfile.mkdtemp(prefix="moss-demo-")
    print("starting llm, vocoder and gateway (tiny presets, the codec's flow + HiFT; RANDOM weights: the audio is noise, "
          "the timings are real) ...")
    device = ["--device", args.device]
    vocoder = [*device, "--preset", "tiny-codec"]
    ports = Ports.free(http=True)
    with Stack(ports, log_dir=logs, extra_args={"llm": device, "vocoder": vocoder}) as stack:
        print(f"gateway on {stack.target('gateway')} (gRPC) and http://127.0.0.1:{ports.http} (OpenAI's "
              f"/v1/audio/speech); service logs in {logs}")
        sampling = common_pb2.SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
        asyncio.run(synthesize(stack.target("gateway"), "Warm up.", sampling=common_pb2.SamplingParams(max_new_tokens=4)))
        result = asyncio.run(synthesize(stack.target("gateway"), args.text, sampling=sampling))
    write_wav(args.out, result.samples, result.sample_rate)
    print(f'said: "{args.text}"')
    print_timings(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
