"""The HTTP door's voices (voice_book.py), as OpenAI-style servers that clone voices take them:

    POST   /v1/audio/voices          multipart/form-data: `file` (a recording: WAV, FLAC, Ogg, ...), `name`
                                     → 201 {"id", "object": "voice", "name", "own", "prompt_seconds", "fast", "kept"}
    GET    /v1/audio/voices          → {"object": "list", "data": [{"id", "object", "name", "own"}], "voices": [names]}
    DELETE /v1/audio/voices/{name}   → {"id", "object": "voice", "deleted": true}

Errors as every route's (http_errors.py): 400 naming the field (`file`, `name`), 404, 409 (the name is taken), 429,
503. A recording's upload may be larger than a speech request (MAX_UPLOAD_BYTES), and has --http-request-seconds to
arrive. A page of another site may not make or delete a voice: a browser's Origin must be the page's own or one of
--allowed-origins (a form can be posted across sites without asking first).
"""

from __future__ import annotations

import asyncio

from aiohttp import BodyPartReader, web

from services.common.errors import InvalidArgument, PermissionDenied, echo
from services.gateway.voice_book import VoiceBook, recording_of_file
from services.gateway.voice_owners import owner_of

ROUTE = "/v1/audio/voices"
MAX_UPLOAD_BYTES = 16 << 20  # 8 s at 192 kHz in float32 stereo, and room for a file's headers
NAME_BYTES = 256             # a name field longer than this is refused unread


def voice_json(info) -> dict:
    return {"id": info.name, "object": "voice", "name": info.name, "own": info.own}


class VoiceRoutes:
    def __init__(self, book: VoiceBook, client_of, origin_ok, request_seconds: float, budget: float = 60.0):
        """client_of(request): who asks (admission.client_id); origin_ok(request): its Origin, if any, may act here;
        request_seconds: for the upload to arrive; budget: seconds a voice may take to make."""
        self.book, self.client_of, self.origin_ok = book, client_of, origin_ok
        self.request_seconds, self.budget = request_seconds, budget

    def routes(self) -> list:
        return [web.post(ROUTE, self.create), web.get(ROUTE, self.list), web.delete(ROUTE + "/{name}", self.delete)]

    async def list(self, request: web.Request) -> web.Response:
        voices = self.book.listing(owner_of(self.client_of(request)))
        return web.json_response({"object": "list", "data": [voice_json(v) for v in voices],
                                  "voices": [v.name for v in voices]})

    async def create(self, request: web.Request) -> web.Response:
        self._check_origin(request)
        if request.content_type != "multipart/form-data":
            raise InvalidArgument("file", f"Content-Type {echo(request.content_type)}: send multipart/form-data with "
                                          "`file` (the recording) and `name`")
        try:
            fields = await asyncio.wait_for(self._form(request), self.request_seconds)
        except TimeoutError:
            raise InvalidArgument("file", f"the upload did not arrive within {self.request_seconds:g} s "
                                          "(--http-request-seconds)") from None
        if "file" not in fields:
            raise InvalidArgument("file", "missing: the recording of the speaker, a sound file")
        if "name" not in fields:
            raise InvalidArgument("name", "missing: the voice's name")
        recording = recording_of_file(fields["file"])
        info = await self.book.create(fields["name"].decode("utf-8", "replace").strip(), recording,
                                      owner_of(self.client_of(request)), self.budget, field="file")
        return web.json_response({**voice_json(info), "prompt_seconds": round(info.prompt_seconds, 3),
                                  "fast": info.fast, "kept": info.kept}, status=201)

    async def delete(self, request: web.Request) -> web.Response:
        self._check_origin(request)
        name = request.match_info["name"]
        await self.book.delete(name, owner_of(self.client_of(request)), self.budget)
        return web.json_response({"id": name, "object": "voice", "deleted": True})

    def _check_origin(self, request: web.Request) -> None:
        if not self.origin_ok(request):
            raise PermissionDenied(f"origin {echo(request.headers.get('Origin', ''))} may not change this gateway's "
                                   "voices (--allowed-origins)")

    async def _form(self, request: web.Request) -> dict[str, bytes]:
        """The form's `file` and `name` (other fields skipped), each read up to its limit."""
        fields: dict[str, bytes] = {}
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise InvalidArgument("file", "a nested multipart body is not a form field")
            limit = MAX_UPLOAD_BYTES if part.name == "file" else NAME_BYTES
            data = bytearray()
            while chunk := await part.read_chunk(64 << 10):
                data += chunk
                if len(data) > limit:
                    raise InvalidArgument(part.name or "file", f"over {limit} bytes")
            if part.name in ("file", "name"):
                fields[part.name] = bytes(data)
        return fields
