#!/usr/bin/env python3
"""A stand-in external agent for `rsim run --worker cmd:...`: a real MCP client (the official Python
SDK) that does a worker's task through the study's tools, knowing only what the orchestrator puts in
its environment (RSIM_MCP_URL, RSIM_MCP_TOKEN, RSIM_NODE, RSIM_ROLE, RSIM_PROMPT).

STANDIN_MODE=greedy makes it start more training runs than its task allows (the orchestrator must
stop it); STANDIN_MODE=forbidden makes it try a reviewer-only tool first (the server must refuse);
STANDIN_MODE=idle makes it train nothing and conclude with a made-up result, first naming a
checkpoint that does not exist (the campaign must neither believe it nor branch without end).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def log(msg: str) -> None:
    print(f"standin: {msg}", file=sys.stderr, flush=True)


async def main() -> int:
    url, token = os.environ["RSIM_MCP_URL"], os.environ["RSIM_MCP_TOKEN"]
    node, role = os.environ.get("RSIM_NODE", ""), os.environ.get("RSIM_ROLE", "")
    mode = os.environ.get("STANDIN_MODE", "")
    if "## Your task" not in os.environ.get("RSIM_PROMPT", ""):
        log("no task in RSIM_PROMPT")
        return 2
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                      read_timeout_seconds=300) as c:

        async def call(name: str, args: dict[str, Any], ok: bool = True) -> dict[str, Any]:
            r = await c.call_tool(name, args)
            text = " ".join(getattr(x, "text", "") for x in r.content)
            if r.is_error:
                if ok:
                    raise SystemExit(f"standin: {name} failed: {text}")
                log(f"{name} refused: {text}")
                return {"error": text}
            sc = r.structured_content or {}
            if sc.get("status") == "running":
                sc = await call("wait_job", {"job": sc["job"], "timeout_s": 300})
            return sc

        if role != "worker":
            log(f"only the worker role is scripted, not {role!r}")
            return 2
        if mode == "forbidden":
            await call("review", {"node": node, "summary": "a worker reviewing itself"}, ok=False)
        if mode == "idle":
            await call("conclude", {"node": node, "outcome": "positive", "best_checkpoint": "f" * 64,
                                    "findings": "dev exact match 1.000 (trust me)"}, ok=False)
            await call("conclude", {"node": node, "outcome": "positive",
                                    "findings": "dev exact match 1.000 (trust me)"})
            log("concluded without training")
            return 0
        info = await call("get_node", {"node": node})
        log(f"working on {info['id']}: {info['title']}")
        name = f"standin-{node}"
        # A node returned to the frontier may already have its dataset: reuse it.
        reg = await call("register_dataset", {
            "node": node, "name": name,
            "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain", "n": 2000, "seed": 1},
        }, ok=False)
        if "error" in reg and "dataset-name-taken" not in reg["error"]:
            raise SystemExit(f"standin: register_dataset failed: {reg['error']}")
        runs = 3 if mode == "greedy" else 1
        best = None
        for seed in range(runs):
            r = await call("run_sft", {"node": node, "base": "base", "datasets": [name],
                                       "learning_rate": 0.003, "steps": 40, "batch_size": 16, "seed": seed})
            ck = r["checkpoint"]
            e = await call("evaluate", {"node": node, "checkpoint": ck, "task": "add2", "split": "dev"})
            score = e["metrics"]["exact_match"]
            if best is None or score > best[1]:
                best = (ck, score)
            if mode == "greedy":
                await anyio.sleep(1.5)  # let the orchestrator see each run
        assert best is not None
        await call("conclude", {"node": node, "outcome": "inconclusive", "best_checkpoint": best[0],
                                "findings": f"stand-in agent: dev exact match {best[1]:.3f}"})
        log("concluded")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
