#!/usr/bin/env python3
"""A small real agent program for the external harness's tests: the `openai` client against
OPENAI_BASE_URL, leanrl's Lean tools over HTTP (httpx) at LEANRL_TOOLS_URL.

It offers the model the episode's tools, runs every tool call the model makes, sends the results
back, and stops when the model submits or answers without a call (printing the answer). AGENT_MODE
picks a misbehaviour: ``crash`` (exit 3 after one request), ``hang`` (sleep forever after one
request), ``greedy`` (keep asking past every budget), ``stdout`` (print a Lean block, no submit),
``child`` (start a child that sleeps, then hang), ``stream`` (ask with stream=True);
AGENT_ONLY_SAMPLE=k misbehaves in sample k's episode only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
from openai import OpenAI

mode = os.environ.get("AGENT_MODE", "normal")
only = os.environ.get("AGENT_ONLY_SAMPLE")  # misbehave in this sample's episode only
if only is not None and not os.environ["LEANRL_EPISODE"].endswith("/" + only):
    mode = "normal"
task = json.loads(sys.stdin.readline())
tools_url = os.environ["LEANRL_TOOLS_URL"]
key = os.environ["OPENAI_API_KEY"]
auth = {"Authorization": f"Bearer {key}"}
client = OpenAI(max_retries=0, timeout=60)
model = os.environ["LEANRL_MODEL"]

if mode == "stdout":
    print(f"Here it is:\n```lean4\n{task['formal_statement']}\n  omega\n```")
    sys.exit(0)

tools = httpx.get(f"{tools_url}/tools", headers=auth).json()
messages: list[dict] = [
    {"role": "system", "content": "Prove it with the tools."},
    {"role": "user", "content": f"Prove:\n{task['formal_statement']}"},
]
for _ in range(50):
    if mode == "stream":
        chunks = list(
            client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True)
        )
        delta = chunks[0].choices[0].delta
        msg = {"role": "assistant", "content": delta.content}
        calls = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in (delta.tool_calls or [])
        ]
    else:
        try:
            out = client.chat.completions.create(model=model, messages=messages, tools=tools)
        except Exception as e:
            if mode == "greedy":
                print(f"refused: {e}", file=sys.stderr)
                sys.exit(0)
            raise
        m = out.choices[0].message
        msg = {"role": "assistant", "content": m.content}
        calls = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in (m.tool_calls or [])
        ]
    if calls:
        msg["tool_calls"] = calls
    messages.append(msg)
    if mode == "crash":
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    if mode == "child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        time.sleep(3600)
    if not calls:
        if mode == "greedy":
            messages.append({"role": "user", "content": "again"})
            continue
        print(msg["content"] or "")
        break
    done = False
    for c in calls:
        r = httpx.post(
            f"{tools_url}/tools/{c['function']['name']}",
            headers=auth,
            json=json.loads(c["function"]["arguments"] or "{}"),
        ).json()
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": r["result"]})
        done = done or r.get("submitted", False)
    if done:
        break
