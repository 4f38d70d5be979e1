"""LLM agent: asks any OpenAI-compatible chat-completions endpoint for transformations.

It sends the Program, the cost report, what memory knows and the list of transformation records
with their parameters, and asks for JSON: `{"transformations": [{"name": ..., "params": {...}},
...]}`. The answer is untrusted data: it is size-limited, parsed as JSON only, decoded record by
record with `ir.transformation_from_obj`, and every record must pass `ir.check` and the runtime's
`check_runnable`; anything else is refused with the reason and never executed. A network
failure or a garbage answer is a note of the round, not an error of the compile.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any, List, Optional, Tuple

from specpilot.ir import (TRANSFORMATIONS, Program, Transformation, program_to_obj,
                          transformation_from_obj)
from specpilot.ir.errors import IRError, SpecPilotError

from .base import Agent, Budget, Refusal, refusal

MAX_RESPONSE_BYTES = 1 << 20
MAX_ITEMS = 64
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_KEY_ENV = "OPENAI_API_KEY"

SYSTEM_PROMPT = (
    "You optimise a speculative decoder described as an IR Program. Reply with JSON only: "
    "{\"transformations\": [{\"name\": NAME, \"params\": {...}}, ...]} using only the "
    "transformation names and parameter types listed in the request, at most `budget` of them, "
    "best first. Every proposal is checked for legality and token-forced against plain greedy "
    "decoding; only lossless speedups are kept.")


class LLMAgentError(SpecPilotError):
    """A bad endpoint setting (the URL or model name)."""


def chat_url(endpoint: str) -> str:
    """The chat-completions URL of an endpoint given as its base (`http://host/v1`) or in full."""
    if not endpoint.startswith(("http://", "https://")):
        raise LLMAgentError(f"--llm-endpoint must be an http:// or https:// URL, got {endpoint!r}")
    url = endpoint.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def transformation_catalogue() -> List[dict]:
    """Every registered transformation: name, parameter kinds, and what it does."""
    return [{"name": name, "params": dict(cls.PARAMS),
             "doc": " ".join((cls.__doc__ or "").split())[:400]}
            for name, cls in sorted(TRANSFORMATIONS.items())]


def _first_json(text: str) -> Any:
    """The first JSON object or array in `text` (code fences and prose around it ignored)."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                return decoder.raw_decode(text, i)[0]
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object or array in the answer")


def parse_answer(content: str, program: Program,
                 limit: int) -> Tuple[List[Transformation], List[Refusal]]:
    """Decode and check an answer's transformations: (accepted, refused with reasons)."""
    try:
        data = _first_json(content)
    except ValueError as exc:
        return [], [Refusal(content[:80], f"malformed answer: {exc}")]
    items = data.get("transformations") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [], [Refusal(content[:80], "malformed answer: expected a list under "
                                          "\"transformations\"")]
    accepted: List[Transformation] = []
    refused: List[Refusal] = []
    for i, item in enumerate(items[:MAX_ITEMS]):
        shown = json.dumps(item)[:120] if _jsonable(item) else repr(item)[:120]
        try:
            t = transformation_from_obj(item, f"transformations[{i}]")
        except IRError as exc:
            refused.append(Refusal(shown, f"malformed: {exc}"))
            continue
        reason = refusal(program, t)
        if reason is not None:
            refused.append(Refusal(str(t), f"illegal: {reason}"))
        elif t in accepted:
            refused.append(Refusal(str(t), "duplicate"))
        elif len(accepted) >= limit:
            refused.append(Refusal(str(t), f"over the budget of {limit} proposals"))
        else:
            accepted.append(t)
    if len(items) > MAX_ITEMS:
        refused.append(Refusal(f"{len(items) - MAX_ITEMS} more items", "ignored: too many"))
    return accepted, refused


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


class LLMAgent(Agent):
    direction = "llm"
    categories = ()   # a generalist: ranked by the whole gap

    def __init__(self, endpoint: str, model: str, key_env: str = DEFAULT_KEY_ENV,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        if not model:
            raise LLMAgentError("--llm-model is required with --llm-endpoint")
        self.url, self.model = chat_url(endpoint), model
        self.key_env, self.timeout_s = key_env, timeout_s

    def request_body(self, program: Program, cost_report, memory, budget: Budget) -> dict:
        payload = {
            "program": program_to_obj(program),
            "cost_report": cost_report.to_json() if cost_report is not None else None,
            "memory": memory.summary() if memory is not None else [],
            "budget": budget.max_proposals,
            "transformations": transformation_catalogue(),
        }
        return {"model": self.model, "temperature": 0,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": json.dumps(payload, sort_keys=True)}]}

    def _post(self, body: dict) -> Optional[str]:
        """The answer's message content, or None (with a note) when there is none."""
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"),
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            self.notes.append(f"endpoint answered HTTP {exc.code}: {exc.reason}")
            return None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.notes.append(f"endpoint unreachable: {getattr(exc, 'reason', exc)}")
            return None
        if len(raw) > MAX_RESPONSE_BYTES:
            self.notes.append(f"answer larger than {MAX_RESPONSE_BYTES} bytes: ignored")
            return None
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            self.notes.append("answer is not an OpenAI chat completion: ignored")
            self.refusals.append(Refusal(raw[:80].decode("utf-8", "replace"),
                                         "malformed chat completion"))
            return None
        if not isinstance(content, str):
            self.notes.append("answer has no text content: ignored")
            return None
        return content

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        if budget.max_proposals <= 0:
            return []
        content = self._post(self.request_body(program, cost_report, memory, budget))
        if content is None:
            return []
        accepted, refused = parse_answer(content, program, budget.max_proposals)
        self.refusals += refused
        self.notes.append(f"{self.model}: {len(accepted)} proposals accepted, "
                          f"{len(refused)} refused")
        return accepted
