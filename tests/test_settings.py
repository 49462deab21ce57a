"""Every setting declared once (services/settings.py): each service's settings dataclass drives its command's flags,
`moss-serve up`'s flags and forwarding, and the settings object the command builds; the deploy files use the
declared ports and flags."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path

import pytest
import yaml

from services.cli import parser
from services.encoder.settings import EncoderSettings
from services.gateway.settings import GatewaySettings
from services.llm.settings import LlmSettings
from services.settings import FORWARDED, GRPC_PORTS, METRICS_PORTS, add_flags, flag, forward, from_args, option, options, share
from services.stack import Ports
from services.up import up_service_args
from services.vocoder.settings import VocoderSettings

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"llm": LlmSettings, "vocoder": VocoderSettings, "encoder": EncoderSettings, "gateway": GatewaySettings}

def sample_value(f) -> str:
    """A command-line value for option f other than its default."""
    if f.metadata["choices"]:
        return next(str(c) for c in f.metadata["choices"] if c != f.default)
    if f.name == "block_size":
        return "32"
    if f.name.endswith("_file") or f.name.endswith("_dir"):
        return "/some/path"
    fractional = f.metadata["type"] is share or f.name == "flow_cfg_rate" or f.name.endswith("seconds")
    if fractional or "budget" in f.name or "lead" in f.name or "hold" in f.name:
        return "0.25"
    return "3" if f.name == "first_audio_window" else "7"


@pytest.mark.parametrize("service", SERVICES)
def test_each_declared_option_is_a_flag_of_its_command_with_its_default(service):
    cls = SERVICES[service]
    args = parser().parse_args([service])
    declared = options(cls)
    assert declared, "no options declared"
    for f in declared:
        assert getattr(args, f.name) == f.default, f.name
    settings = from_args(cls, args)
    assert all(getattr(settings, f.name) == f.default for f in declared)


@pytest.mark.parametrize("service", SERVICES)
def test_up_takes_and_forwards_every_forwarded_option(service):
    cls = SERVICES[service]
    forwarded = options(cls, FORWARDED)
    assert forwarded
    argv = ["up"]
    for f in forwarded:
        argv += [flag(f.name), sample_value(f)]
    args = parser().parse_args(argv)
    given = up_service_args(args)[service]
    for f in forwarded:
        at = given.index(flag(f.name))
        assert given[at + 1] == str(getattr(args, f.name)), f.name
    # ... and the service's own command takes what up hands it
    child = parser().parse_args([service, *given])
    for f in forwarded:
        assert getattr(child, f.name) == getattr(args, f.name), f.name


def test_up_defaults_are_the_services_defaults():
    args = parser().parse_args(["up"])
    for cls in SERVICES.values():
        for f in options(cls, FORWARDED):
            assert getattr(args, f.name) == f.default, f.name
    for service in SERVICES:
        assert getattr(args, f"{service}_port") == GRPC_PORTS[service]
        assert getattr(args, f"{service}_metrics_port") == METRICS_PORTS[service]
    assert Ports().grpc == GRPC_PORTS and Ports().metrics == METRICS_PORTS


def test_an_option_declared_in_one_place_appears_everywhere():
    """A new option is one field: its flag, its default, the settings object and the forwarding follow."""
    @dataclasses.dataclass
    class WithAKnob(LlmSettings):
        knob_depth: int = option(3, "how deep the knob goes", type=int)

    p = argparse.ArgumentParser()
    add_flags(p, WithAKnob)
    assert p.parse_args([]).knob_depth == 3 and "--knob-depth" in p.format_help()
    args = p.parse_args(["--knob-depth", "5"])
    assert from_args(WithAKnob, args).knob_depth == 5
    assert forward(args, WithAKnob)[-2:] == ["--knob-depth", "5"]


def test_the_help_states_the_declared_defaults():
    helps = {name: sub.format_help() for name, sub in parser()._subparsers._group_actions[0].choices.items()}
    assert "(default 50052)" in helps["llm"] and "(default 0.1)" in helps["vocoder"]
    assert "default: the codec's flow 32, the stand-in 16" in " ".join(helps["vocoder"].split())  # per decoder
    assert "(default 300.0)" in helps["gateway"] and "(default 300.0)" in helps["up"]


def _compose_commands():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    return {name: shlex.split(compose["services"][name]["command"]) for name in SERVICES}


def test_compose_commands_parse_with_the_declared_flags_and_ports():
    for service, argv in _compose_commands().items():
        args = parser().parse_args(argv)  # an unknown flag would exit here
        assert args.command == service
        assert args.port == GRPC_PORTS[service] and args.metrics_port == METRICS_PORTS[service]


def test_the_docs_name_the_declared_ports():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for service in SERVICES:
        assert f"{GRPC_PORTS[service]}, {METRICS_PORTS[service]}" in text, service


def test_the_command_line_and_the_gateway_start_without_torch():
    """`moss-serve` reads every service's settings, and the gateway never computes: importing torch (~2 s of CPU a
    process) is for the llm, vocoder and encoder alone. A fresh interpreter, as a service process starts."""
    import subprocess
    import sys

    code = ("import sys, services.cli, services.gateway.server, services.up, services.bench.sweep; "
            "print(sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_flag_of_up_and_the_services_stands_in_a_group():
    """--help lists every flag under its stage or concern (services/settings.py's groups): none under argparse's
    catch-all 'options' but --help itself, and each service's flags under the same titles as up's."""
    from services.cli import GROUP_ORDER, parser
    from services.encoder.settings import EncoderSettings
    from services.gateway.settings import GatewaySettings
    from services.llm.settings import LlmSettings
    from services.settings import FORWARDED, flag, options
    from services.vocoder.settings import VocoderSettings

    settings = {"llm": LlmSettings, "vocoder": VocoderSettings, "encoder": EncoderSettings, "gateway": GatewaySettings}
    commands = parser()._subparsers._group_actions[0].choices
    up_titles = {}
    for name in ("up", "llm", "vocoder", "encoder", "gateway"):
        command = commands[name]
        for group in command._action_groups:
            flags = [a.option_strings[0] for a in group._group_actions if a.option_strings]
            if group.title not in GROUP_ORDER:
                assert flags in ([], ["-h"]), (name, group.title, flags)
            elif name == "up":
                up_titles.update(dict.fromkeys(flags, group.title))
            else:
                handed_on = {flag(f.name) for f in options(settings[name], FORWARDED)}
                for one in set(flags) & handed_on:  # (a flag up hands on: in the same group in both)
                    assert up_titles[one] == group.title, (name, one)
    assert len(up_titles) > 70  # (up has ~80 flags)
