"""Clients of tests/e2e/e2e_gateway.rs, run with the engine venv's python (openai, httpx).

python e2e_gateway_client.py PHASE BASE_URL KEY [ARGS...]; prints one JSON object on stdout
(and, for `stream`, a line `first-token` as soon as text arrives).
"""
import json
import sys
import threading
import time

import httpx
import openai
from openai import OpenAI

MODEL = "tiny-llama"


def basic(base, key, wrong):
    c = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
    out = {"models": [m.id for m in c.models.list().data]}
    chat = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "def main():"}], max_tokens=16, temperature=0
    )
    out["chat"] = chat.choices[0].message.content
    pieces = []
    for ch in c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "import os"}], max_tokens=16, temperature=0, stream=True
    ):
        if ch.choices and ch.choices[0].delta.content:
            pieces.append(ch.choices[0].delta.content)
    out["chat_stream_chunks"] = len(pieces)
    out["chat_stream"] = "".join(pieces)
    comp = c.completions.create(model=MODEL, prompt="import sys\n", max_tokens=16, temperature=0)
    out["completion"] = comp.choices[0].text
    out["completion_tokens"] = comp.usage.completion_tokens
    try:
        OpenAI(base_url=base, api_key=wrong, max_retries=0).models.list()
        out["wrong_key"] = "accepted"
    except openai.AuthenticationError as e:
        out["wrong_key"] = e.status_code
    return out


def over(base, key, seed, words):
    """A completion of about `words` words with a marker seed (vLLM logs the sampling params)."""
    c = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
    prompt = " ".join(f"w{i}" for i in range(int(words)))
    try:
        c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, seed=int(seed))
        return {"status": 200}
    except openai.APIStatusError as e:
        return {"status": e.status_code, "body": e.response.json()}


def one_stream(base, key, max_tokens, prompt, deadline=None, quiet=False):
    """A raw SSE completion stream: status, text events, the terminal error event, [DONE].

    With `deadline` (seconds): a request not ended by then, or silent that long (waiting in the
    gateway's queue for its headers included), is left and marked `hung`."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    r = {"status": None, "events": 0, "tokens": None, "done": False, "error": None, "finish": None,
         "retry_after": None}
    t = time.time()
    read = 180 if deadline is None else deadline
    try:
        with httpx.stream("POST", base + "/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=httpx.Timeout(read, connect=10)) as resp:
            r["status"] = resp.status_code
            r["retry_after"] = resp.headers.get("retry-after")
            if resp.status_code != 200:
                r["body"] = json.loads(resp.read())
                r["seconds"] = round(time.time() - t, 2)
                return r
            for line in resp.iter_lines():
                if deadline is not None and time.time() - t > deadline:
                    r["hung"] = True
                    break
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    r["done"] = True
                    continue
                ev = json.loads(data)
                if "error" in ev:
                    r["error"] = ev["error"]
                    continue
                if ev.get("usage"):
                    r["tokens"] = ev["usage"]["completion_tokens"]
                if ev.get("choices"):
                    if r["events"] == 0 and not quiet:
                        print("first-token", flush=True)
                    r["events"] += 1
                    r["finish"] = ev["choices"][0].get("finish_reason") or r["finish"]
    except httpx.TimeoutException as e:
        r["hung"] = True
        r["transport_error"] = repr(e)
    except httpx.HTTPError as e:
        r["transport_error"] = repr(e)
    r["seconds"] = round(time.time() - t, 2)
    return r


def abandon(base, key, request_id):
    """A stream (vLLM's request id from X-Request-Id) left after its first text: the connection closes."""
    body = {"model": MODEL, "prompt": "# abandon\nimport", "max_tokens": 480, "temperature": 0, "stream": True,
            "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}", "X-Request-Id": request_id}
    r = {"status": None, "text_events": 0}
    with httpx.stream("POST", base + "/completions", json=body, headers=headers,
                      timeout=httpx.Timeout(180, connect=10)) as resp:
        r["status"] = resp.status_code
        for line in resp.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                r["text_events"] += 1
                break
    # Leaving the `with` closes the connection mid-stream.
    return r


def load(base, key, n, seconds, max_tokens, deadline):
    """`n` clients at once, each streaming one request after another until `seconds` have passed
    (the last one started before then runs to its end); after a 429 a client waits the
    Retry-After seconds, then tries again. Every request's result (in the order they ended, with
    its client and start second) and the phase's wall time."""
    out, lock = [], threading.Lock()
    start = time.time()
    end = start + float(seconds)

    def run(i):
        k = 0
        while time.time() < end:
            t = time.time()
            r = one_stream(base, key, int(max_tokens), f"# load {i}.{k}\nimport", deadline=float(deadline), quiet=True)
            r["client"], r["started"] = i, round(t - start, 2)
            with lock:
                out.append(r)
            k += 1
            if r["status"] == 429:
                time.sleep(float(r["retry_after"] or 1))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(int(n))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"streams": out, "seconds": round(time.time() - start, 2)}


def main():
    phase, base, key, *args = sys.argv[1:]
    if phase == "basic":
        r = basic(base, key, *args)
    elif phase == "over":
        r = over(base, key, *args)
    elif phase == "stream":
        r = one_stream(base, key, int(args[0]), args[1])
    elif phase == "abandon":
        r = abandon(base, key, *args)
    elif phase == "load":
        r = load(base, key, *args)
    else:
        raise SystemExit(f"unknown phase {phase}")
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
