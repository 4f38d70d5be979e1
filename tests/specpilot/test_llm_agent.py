"""The LLM agent against a local OpenAI-compatible server (http.server on 127.0.0.1 in a thread)
that answers with good, illegal and garbage proposals: only legal records come out, everything
else is refused with a reason, and nothing raises."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specpilot.agents import Budget, LLMAgent, LLMAgentError
from specpilot.cost import AssumedAcceptance, CostModel, gpu_spec
from specpilot.deploy import build_deployment
from specpilot.ir import SetDraftLength, SetTopology, Tree, check, stock_program
from hf_factory import make_pair


class Server:
    """Answers each POST with the next scripted reply: (status, body bytes, delay seconds)."""

    def __init__(self):
        self.replies, self.requests = [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                outer.requests.append((self.path, dict(self.headers),
                                       json.loads(self.rfile.read(length))))
                status, body, delay = outer.replies.pop(0)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def reply(self, content=None, status=200, raw=None, delay=0.0):
        body = raw if raw is not None else json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.replies.append((status, body, delay))

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    target, drafter = make_pair(tmp_path_factory.mktemp("pair"), "llama3")
    return stock_program(build_deployment(target, drafter, gpu="cpu", dtype="float32"))


def report_of(program):
    return CostModel(gpu_spec("cpu")).report(program, AssumedAcceptance(0.6))


def agent(server, **kw):
    return LLMAgent(server.url, "test-model", key_env="SPECPILOT_TEST_LLM_KEY", timeout_s=2.0,
                    **kw)


def test_good_answer_gives_checked_records_and_the_request_carries_the_program(
        server, program, monkeypatch):
    monkeypatch.setenv("SPECPILOT_TEST_LLM_KEY", "sekret")
    answer = {"transformations": [
        {"name": "SetDraftLength", "params": {"k": 2}},
        {"name": "SetTopology", "params": {"topology": {"kind": "tree", "branching": [2, 1]}}}]}
    server.reply("Here you go:\n```json\n" + json.dumps(answer) + "\n```")
    a = agent(server)
    proposals = a.propose(program, report_of(program), None, Budget(4))
    assert proposals == [SetDraftLength(2), SetTopology(Tree((2, 1)))]
    assert all(check(program, t) is None for t in proposals)
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sekret"
    payload = json.loads(body["messages"][1]["content"])
    assert payload["program"]["draft"]["topology"] == {"kind": "chain", "k": 4}
    assert payload["cost_report"]["dominant"] == report_of(program).dominant
    assert "SetWeightFormat" in {t["name"] for t in payload["transformations"]}
    assert body["model"] == "test-model"


def test_illegal_and_malformed_records_are_refused_with_reasons(server, program):
    server.reply(json.dumps({"transformations": [
        {"name": "SetDraftLength", "params": {"k": 4}},            # already chain(4)
        {"name": "SetDraftLength", "params": {"k": "four"}},       # wrong type
        {"name": "RewriteKernelSource", "params": {"code": "import os"}},   # unknown record
        {"name": "SetMaxBatchSize", "params": {"max_batch_size": 100000}},  # out of range
        {"name": "SetDraftLength", "params": {"k": 3}},             # legal
        "not even an object"]}))
    a = agent(server)
    proposals = a.propose(program, report_of(program), None, Budget(4))
    assert proposals == [SetDraftLength(3)]
    reasons = [r.reason for r in a.refusals]
    assert len(reasons) == 5
    assert any("already chain(4)" in r for r in reasons)
    assert any("malformed" in r and "expected int" in r for r in reasons)
    assert any("unknown transformation 'RewriteKernelSource'" in r for r in reasons)
    assert any("max batch size must be in 1..256" in r for r in reasons)


def test_budget_limits_the_accepted_records(server, program):
    server.reply(json.dumps([{"name": "SetDraftLength", "params": {"k": k}} for k in (1, 2, 3)]))
    a = agent(server)
    assert a.propose(program, None, None, Budget(2)) == [SetDraftLength(1), SetDraftLength(2)]
    assert any("over the budget" in r.reason for r in a.refusals)


@pytest.mark.parametrize("reply", [
    dict(content="I think you should make it faster."),            # prose, no JSON
    dict(content='{"transformations": {"name": "SetDraftLength"}}'),  # not a list
    dict(raw=b"<html>502 Bad Gateway</html>"),                      # not a chat completion
    dict(raw=b"{}", status=500),                                    # an HTTP error
    dict(content=None),                                             # no text content
])
def test_garbage_answers_give_nothing_and_do_not_raise(server, program, reply):
    server.reply(**reply)
    a = agent(server)
    assert a.propose(program, None, None, Budget(3)) == []
    assert a.notes or a.refusals


def test_a_slow_endpoint_times_out(server, program):
    server.reply(json.dumps({"transformations": []}), delay=1.5)
    a = LLMAgent(server.url, "m", timeout_s=0.3)
    started = time.perf_counter()
    assert a.propose(program, None, None, Budget(3)) == []
    assert time.perf_counter() - started < 1.4
    assert any("unreachable" in n for n in a.notes)


def test_an_oversized_answer_is_ignored(server, program, monkeypatch):
    import specpilot.agents.llm as llm
    monkeypatch.setattr(llm, "MAX_RESPONSE_BYTES", 64)
    server.reply("x" * 500)
    a = agent(server)
    assert a.propose(program, None, None, Budget(3)) == []
    assert any("larger than" in n for n in a.notes)


def test_endpoint_settings_are_checked():
    with pytest.raises(LLMAgentError, match="http"):
        LLMAgent("ftp://example", "m")
    with pytest.raises(LLMAgentError, match="--llm-model"):
        LLMAgent("http://127.0.0.1:1/v1", "")
    assert LLMAgent("http://h/v1/chat/completions", "m").url == "http://h/v1/chat/completions"


def test_llm_proposals_go_through_a_compile_round(server, tmp_path):
    from specpilot.search.compile import compile_deployment
    from test_search_support import agreeing_pair, small_settings

    server.reply(json.dumps({"transformations": [
        {"name": "SetDraftLength", "params": {"k": 1}},
        {"name": "SetWeightFormat", "params": {"scope": "target.*", "fmt": "lossless12"}},
        "garbage"]}))
    settings = small_settings(tmp_path, *agreeing_pair(tmp_path), llm_endpoint=server.url,
                              llm_model="test-model", llm_budget=2)
    compile_deployment(settings, progress=lambda _: None)
    record = json.load(open(tmp_path / "runs" / "t" / "round-1" / "report.json"))
    llm = [o for o in record["outcomes"] if o["direction"] == "llm"]
    timed = [o for o in llm if o["forcing"]]
    assert [o["label"] for o in timed] == [str(SetDraftLength(1))]
    assert timed[0]["forcing"]["passed"]
    refused = [o for o in llm if o["stage"] == "proposal"]
    assert len(refused) == 2 and all(o["reason"] for o in refused)
    payload = json.loads(server.requests[0][2]["messages"][1]["content"])
    assert payload["budget"] == 2 and payload["memory"] == []
