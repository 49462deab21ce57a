"""Who owns each voice made through the API (services/gateway/voice_owners.py), and when the voice book refuses to
make one before any work (voice_book.py): in-process, without a stack (the whole path: tests/test_voice_api.py)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from services.common.errors import AlreadyExists, FailedPrecondition, ResourceExhausted, Unavailable
from services.gateway import voice_owners
from services.gateway.voice_book import MAX_MAKING, VoiceBook
from services.gateway.voice_owners import SHARED, VoiceOwners, owner_of


def test_the_owner_is_a_keys_digest_and_everyone_without_one():
    assert owner_of("key:0123abcd") == "key:0123abcd"
    assert owner_of("ipv4:10.0.0.7") == SHARED and owner_of(None) == SHARED  # (an address owns nothing)


def test_a_voice_is_its_owners_alone_and_the_vocoders_own_are_everyones(tmp_path):
    owners = VoiceOwners(tmp_path / "owners.json")
    owners.record("mine", "key:a")
    owners.record("ours", SHARED)
    assert owners.usable(["default", "mine", "ours"], "key:a") == ("default", "mine", "ours")
    assert owners.usable(["default", "mine", "ours"], "key:b") == ("default", "ours")
    assert owners.usable(["default", "mine", "ours"], SHARED) == ("default", "ours")
    assert (owners.made("mine"), owners.made("default"), owners.owner("default")) == (True, False, None)
    assert owners.count("key:a") == 1 and owners.count("key:b") == 0
    again = VoiceOwners(tmp_path / "owners.json")                     # a gateway started again
    assert again.owner("mine") == "key:a" and again.owner("ours") == SHARED
    owners.forget("mine")
    assert json.loads((tmp_path / "owners.json").read_text()) == {"voices": {"ours": ""}}
    assert (tmp_path / "owners.json").stat().st_mode & 0o777 == 0o600


def test_gateways_sharing_the_file_see_each_others_changes_and_lose_none(tmp_path, monkeypatch):
    monkeypatch.setattr(voice_owners, "FRESH_SECONDS", 0.0)
    one, two = VoiceOwners(tmp_path / "owners.json"), VoiceOwners(tmp_path / "owners.json")
    one.record("a", "key:a")
    assert two.owner("a") == "key:a"                                   # read again once changed
    names = [f"v{i}" for i in range(40)]
    threads = [threading.Thread(target=lambda n=n, g=g: g.record(n, "key:b")) for n, g in zip(names, [one, two] * 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(VoiceOwners(tmp_path / "owners.json").owners) == sorted(["a", *names])  # every change kept


def test_a_spoilt_file_stops_the_start_and_not_a_serving_gateway(tmp_path, monkeypatch):
    path = tmp_path / "owners.json"
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a voice owners file"):
        VoiceOwners(path)
    monkeypatch.setattr(voice_owners, "FRESH_SECONDS", 0.0)
    path.write_text(json.dumps({"voices": {"mine": "key:a"}}))
    owners = VoiceOwners(path)
    path.write_text("spoilt by hand")
    assert owners.owner("mine") == "key:a"                             # the last good copy goes on


def replica(voices=("default",), ready=True, max_prompt_seconds=7.04, max_voices=5):
    return SimpleNamespace(ready=ready, voices=voices, max_prompt_seconds=max_prompt_seconds, max_voices=max_voices,
                           target="127.0.0.1:1")


def book_over(*replicas, max_per_key=2) -> VoiceBook:
    backends = SimpleNamespace(vocoder=SimpleNamespace(replicas=list(replicas)),
                               voices=lambda owner=None: tuple(sorted({v for r in replicas for v in r.voices})))
    return VoiceBook(backends, VoiceOwners(), max_per_key)


def test_the_book_refuses_before_any_work_what_it_cannot_make():
    book = book_over(replica(), replica())
    assert len(book._check_room("new", "key:a")) == 2
    with pytest.raises(AlreadyExists):
        book._check_room("default", "key:a")
    book.owners.record("x1", "key:a")
    book.owners.record("x2", "key:a")
    with pytest.raises(ResourceExhausted, match="its most voices, 2"):
        book._check_room("new", "key:a")
    book._check_room("new", SHARED)                                    # (no key: no per-key count)
    book.making["other"] = "key:b"
    with pytest.raises(ResourceExhausted, match="one at a time") as err:
        book._check_room("new", "key:b")
    assert err.value.retry_after == 1.0
    for i in range(MAX_MAKING):
        book.making[f"m{i}"] = f"key:{i + 10}"
    with pytest.raises(ResourceExhausted, match=f"making {MAX_MAKING} voices already"):
        book._check_room("new", "key:c")
    with pytest.raises(Unavailable, match="not ready: a voice goes to every replica or to none"):
        book_over(replica(), replica(ready=False))._check_room("new", "key:a")
    with pytest.raises(FailedPrecondition, match="stand-in"):
        book_over(replica(max_prompt_seconds=0.0))._check_room("new", "key:a")
    with pytest.raises(ResourceExhausted, match="the vocoder holds its most voices, 1"):
        book_over(replica(max_voices=1))._check_room("new", "key:a")
