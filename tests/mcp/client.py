#!/usr/bin/env python3
"""rsim's MCP face through the official Python SDK client (`mcp`, pinned in requirements.txt).

Connects over streamable HTTP (`--url`) or stdio (`--rsim BIN --study DIR`), in either protocol era
(`--mode legacy` = initialize handshake, `--mode 2026-07-28` = stateless), and checks what an agent
relies on: the tool set and its schemas, every tool with good arguments in a research-like order,
bad arguments answered with `isError` naming the field, progress notifications for long jobs,
cancellation, resources, prompts and roles (a reviewer and an observer connect over stdio).

Prints one line per check on stdout and ends with `RESULT passed=N failed=M`; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any, ClassVar, Literal

import anyio
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.types import CallToolResult, GetTaskRequest, GetTaskRequestParams
from mcp_types import Result
from pydantic import ConfigDict, TypeAdapter

WRITERS = {"branch", "register_dataset", "run_sft", "evaluate", "compare", "review", "conclude", "cancel_job"}
QUERIES = {"get_node", "list_nodes", "dag", "log", "diff", "get_job", "wait_job"}
# What each role lists (tests/MCP_CONTRACT.md, "Roles").
ROLE_TOOLS = {
    "worker": (WRITERS | QUERIES) - {"review"},
    "reviewer": {"branch", "compare", "review", "conclude", "reproduce"} | QUERIES,
    "observer": QUERIES,
}
# (readOnlyHint, destructiveHint, idempotentHint) per tool; openWorldHint is false everywhere.
ANNOTATIONS = {name: (True, False, True) for name in QUERIES}
ANNOTATIONS.update({name: (False, False, False) for name in WRITERS})
ANNOTATIONS["conclude"] = (False, True, False)
ANNOTATIONS["reproduce"] = (False, False, False)
ANNOTATIONS["cancel_job"] = (False, True, True)
SHA = "0123456789abcdef" * 4


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class CreatedTask(Result):
    """A tools/call answered as a task (SEP-2663): flat `{resultType: "task", taskId, status, …}`."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class GetTask(GetTaskRequest):
    # 2026-07-28 routes tasks/get by its task id: the `Mcp-Name` header carries `taskId`.
    name_param: ClassVar[str | None] = "taskId"


class Tasks(ClientExtension):
    """The MCP tasks extension, client side (the SDK has no built-in one): declares the extension and
    resolves a task result by polling `tasks/get` until the task is terminal. Records what it saw."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.created: list[CreatedTask] = []
        self.statuses: list[str] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.created.append(task)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = await ctx.session.send_request(
                GetTask(params=GetTaskRequestParams(task_id=task.task_id)), TypeAdapter(dict[str, Any]))
            status = got.get("status")
            self.statuses.append(str(status))
            if status == "completed" and isinstance(got.get("result"), dict):
                return CallToolResult.model_validate(got["result"])
            if status in ("failed", "cancelled"):
                raise RuntimeError(f"task {task.task_id} ended {status}: {short(got)}")
            await anyio.sleep(min(max(got.get("pollIntervalMs", 500), 100), 2000) / 1000)
        raise TimeoutError(f"task {task.task_id} not done after 300 s")


class Checks:
    def __init__(self, label: str) -> None:
        self.label = label
        self.passed = 0
        self.failed = 0
        self.t0 = time.monotonic()

    def at(self) -> str:
        return f"{time.monotonic() - self.t0:.1f}s"

    def ok(self, name: str) -> None:
        self.passed += 1
        print(f"ok   [{self.label}] {name} ({self.at()})", flush=True)

    def fail(self, name: str, why: str) -> None:
        self.failed += 1
        print(f"FAIL [{self.label}] {name} ({self.at()}): {why}", flush=True)

    def check(self, name: str, cond: bool, why: str = "") -> bool:
        if cond:
            self.ok(name)
        else:
            self.fail(name, why or "assertion failed")
        return cond


def describe(e: BaseException) -> str:
    """An exception in one line; exception groups (anyio task groups) are flattened to their leaves."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {str(e)[:400]}"


def text_of(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def short(v: Any, n: int = 300) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= n else s[:n] + "…"


class Session:
    """One flow against one server connection; records checks in `c`."""

    def __init__(self, client: Client, c: Checks, args: argparse.Namespace) -> None:
        self.client = client
        self.c = c
        self.args = args
        self.tag = args.tag
        self.progress_messages: list[tuple[float | None, str | None]] = []

    async def call(self, name: str, arguments: dict[str, Any], **kw: Any) -> Any:
        return await self.client.call_tool(name, arguments, **kw)

    async def good(self, check: str, name: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any] | None:
        """Call a tool that must succeed; returns its structured content."""
        try:
            r = await self.call(name, arguments, **kw)
        except Exception as e:  # noqa: BLE001 - any client-side failure is a failed check
            self.c.fail(check, f"{name} raised {describe(e)}")
            return None
        if r.is_error:
            self.c.fail(check, f"{name} returned isError: {short(text_of(r))}")
            return None
        sc = r.structured_content
        if not isinstance(sc, dict):
            self.c.fail(check, f"{name} returned no structuredContent object: {short(text_of(r))}")
            return None
        try:
            same = json.loads(text_of(r)) == sc
        except ValueError:
            same = False
        if not same:
            self.c.fail(check, f"{name}: the text content is not the structured content as JSON")
            return None
        return sc

    async def bad(self, check: str, name: str, arguments: dict[str, Any], *needles: str) -> None:
        """Call a tool that must fail with isError and a message naming every needle."""
        try:
            r = await self.call(name, arguments)
        except Exception as e:  # noqa: BLE001
            self.c.fail(check, f"expected an isError result, got {describe(e)}")
            return
        msg = text_of(r)
        missing = [n for n in needles if n.lower() not in msg.lower()]
        if not r.is_error:
            self.c.fail(check, f"expected isError, got success: {short(msg)}")
        elif missing:
            self.c.fail(check, f"error message does not name {missing}: {short(msg)}")
        elif r.structured_content is not None:
            self.c.fail(check, f"an error result carries structuredContent: {short(r.structured_content)}")
        else:
            self.c.ok(check)

    async def long_job(self, check: str, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        """run_sft/evaluate: return the final recorded result (through wait_job when the tool answers
        with a running-job handle) and the number of progress notifications received."""
        # Progress per request (run_sft, then wait_job): MCP requires the value to increase.
        progress: list[list[float]] = [[], []]
        self.progress_messages: list[tuple[float | None, str | None]] = []

        def collector(i: int) -> Any:
            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress[i].append(p)
                self.progress_messages.append((total, message))

            return on_progress

        def count() -> int:
            return len(progress[0]) + len(progress[1])

        sc = await self.good(check, name, arguments, progress_callback=collector(0))
        if sc is None:
            return None, count()
        if sc.get("status") == "running" and "job" in sc:
            job = sc["job"]
            sc = await self.good(check, "wait_job", {"job": job, "timeout_s": 300}, progress_callback=collector(1))
            if sc is None:
                return None, count()
        for values in progress:
            if any(b <= a for a, b in zip(values, values[1:])):
                self.c.fail(check, f"progress values of one request do not increase: {values}")
                return None, count()
        return sc, count()

    async def run(self) -> None:
        c = self.c
        t = self.tag

        # -- tool listing ------------------------------------------------------------------------
        tools = (await self.client.list_tools()).tools
        names = {tool.name for tool in tools}
        want = ROLE_TOOLS["worker"]
        c.check("tools/list gives a worker exactly its tools", names == want,
                f"missing {sorted(want - names)}, unexpected {sorted(names - want)}")
        no_schema = [tool.name for tool in tools
                     if not (isinstance(tool.input_schema, dict) and tool.input_schema.get("type") == "object"
                             and isinstance(tool.output_schema, dict) and tool.output_schema)]
        c.check("every tool has an object input schema and an output schema", not no_schema, f"{no_schema}")
        no_desc = [tool.name for tool in tools if not (tool.description and len(tool.description) >= 20)]
        c.check("every tool has a description", not no_desc, f"{no_desc}")
        strict = [tool.name for tool in tools if tool.input_schema.get("additionalProperties") is not False]
        c.check("input schemas reject unknown fields (additionalProperties: false)", not strict, f"{strict}")
        wrong_ann = []
        for tool in tools:
            a = tool.annotations
            got = (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) if a else None
            if tool.name in ANNOTATIONS and got != (*ANNOTATIONS[tool.name], False):
                wrong_ann.append(f"{tool.name}: (readOnly, destructive, idempotent, openWorld)={got}")
        c.check("tool annotations (read-only, destructive, idempotent, open-world) follow the contract",
                not wrong_ann, f"{wrong_ann}")

        # -- good arguments, in the order an agent works --------------------------------------------
        b = await self.good("branch a node from the root", "branch",
                            {"parents": ["n0"], "title": f"{t} plain format", "hypothesis": "Plain answers suffice."})
        node = b["node"] if b else None
        if b:
            c.check("branch result names the new node and commit",
                    isinstance(node, str) and node.startswith("n") and len(b.get("commit", "")) == 40, short(b))
        b2 = await self.good("branch a sibling for comparison", "branch",
                             {"parents": ["n0"], "title": f"{t} reversed format"})
        sib = b2["node"] if b2 else None
        if not node:
            c.fail("the rest of the flow", "no node to work on")
            return
        reg = await self.good("register_dataset (arith generator)", "register_dataset",
                              {"node": node, "name": f"{t}-plain",
                               "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain",
                                          "n": 400, "seed": 1}})
        if reg:
            c.check("register_dataset generates exactly the rows asked for (no skip count)",
                    reg.get("rows", 0) == 400 and "decontaminated" not in reg and reg.get("dataset") == f"{t}-plain",
                    short(reg))
        sft, n_progress = await self.long_job("run_sft a few thousand steps (with wait_job if it is still running)",
                                              "run_sft",
                                              {"node": node, "base": "base", "datasets": [f"{t}-plain"],
                                               "learning_rate": 0.001, "steps": self.args.steps, "batch_size": 16})
        ck = None
        if sft:
            ck = sft.get("checkpoint")
            await self.read_job_log(sft.get("job", {}).get("id"))
            c.check("run_sft records a succeeded job and a checkpoint",
                    sft.get("job", {}).get("state") == "succeeded" and isinstance(ck, str) and len(ck) == 64,
                    short(sft))
        c.check("progress notifications arrive for run_sft/wait_job with a progressToken", n_progress > 0,
                "no notifications/progress received")
        steps = [(t, m) for t, m in self.progress_messages if m and m.startswith("step ")]
        c.check("progress carries the training step lines with the total steps",
                bool(steps) and all(t == self.args.steps for t, _ in steps), short(self.progress_messages[-5:]))
        if ck:
            ev, _ = await self.long_job("evaluate on dev", "evaluate",
                                        {"node": node, "checkpoint": ck, "task": "add2", "split": "dev"})
            if ev:
                em = ev.get("metrics", {}).get("exact_match")
                c.check("evaluate reports exact_match in [0, 1] over the dev items",
                        isinstance(em, (int, float)) and 0 <= em <= 1 and ev.get("n_items", 0) > 0, short(ev))
                job_id = ev.get("job", {}).get("id")
                gj = await self.good("get_job of the evaluation", "get_job", {"job": job_id})
                if gj:
                    c.check("get_job gives the recorded job",
                            gj.get("node") == node and gj.get("job", {}).get("state") == "succeeded", short(gj))
        if sib:
            cmp = await self.good("compare the two siblings", "compare",
                                  {"node": "n0", "nodes": [node, sib], "task": "add2"})
            if cmp:
                c.check("compare has one row per node", len(cmp.get("rows", [])) == 2, short(cmp))
        gn = await self.good("get_node", "get_node", {"node": node})
        if gn:
            kinds = [a.get("action") if isinstance(a, dict) else a for a in gn.get("actions", [])]
            c.check("get_node lists the node's recorded actions",
                    gn.get("id") == node and len(gn.get("actions", [])) >= 3, short(kinds))
        ln = await self.good("list_nodes", "list_nodes", {"limit": 500})
        if ln:
            ids = [n.get("id") for n in ln.get("nodes", [])]
            c.check("list_nodes includes the new nodes", node in ids and "n0" in ids, short(ids))
        dg = await self.good("dag (full view)", "dag", {"view": "full"})
        if dg:
            c.check("dag has the node and its edge from n0",
                    ["n0", node] in dg.get("edges", []), short(dg))
        lg = await self.good("log of the node", "log", {"node": node, "limit": 20})
        if lg:
            acts = lg.get("actions", [])
            c.check("log shows the node's actions, recorded with role worker",
                    len(acts) >= 3 and all(a.get("role") == "worker" for a in acts), short(acts))
        conc = await self.good("conclude the node", "conclude",
                               {"node": node, "outcome": "positive", "findings": f"{t}: plain format learns.",
                                "best_checkpoint": ck})
        if conc:
            c.check("conclude marks the node concluded", conc.get("status") == "concluded", short(conc))

        # -- cancellation --------------------------------------------------------------------------
        if sib:
            await self.cancel_flow(sib)

        # -- bad arguments ------------------------------------------------------------------------
        await self.bad("unknown field is rejected, naming it", "branch",
                       {"parents": ["n0"], "title": "x", "colour": "red"}, "colour")
        await self.bad("wrong type is rejected, naming the field", "branch",
                       {"parents": ["n0"], "title": 42}, "title")
        await self.bad("missing field is rejected, naming it", "branch", {"parents": ["n0"]}, "title")
        await self.bad("nested wrong type is rejected, naming the field", "register_dataset",
                       {"node": "n0", "name": "x", "source": {"kind": "arith", "op": "add", "digits": "two",
                                                              "format": "plain", "n": 10, "seed": 1}}, "digits")
        await self.bad("integer out of range is rejected, naming the field", "run_sft",
                       {"node": "n0", "base": "base", "datasets": ["plain"], "learning_rate": 0.001,
                        "steps": 0, "batch_size": 16}, "steps")
        await self.bad("unknown node is an error naming it", "get_node", {"node": "n999999"}, "n999999")
        await self.bad("policy rejection names the rule", "evaluate",
                       {"node": "n0", "checkpoint": SHA, "task": "add2", "split": "dev"}, "checkpoint-provenance")
        await self.bad("a worker calling review is refused by rule `role`", "review",
                       {"node": "n0", "summary": "not allowed"}, "role")
        try:
            r = await self.call("no_such_tool", {})
            c.fail("unknown tool is JSON-RPC error -32602 naming it", f"a tool result instead: {short(text_of(r))}")
        except MCPError as e:
            c.check("unknown tool is JSON-RPC error -32602 naming it",
                    e.code == -32602 and e.message.startswith('unknown tool "no_such_tool"'), f"{e.code} {e.message}")
        except Exception as e:  # noqa: BLE001
            c.fail("unknown tool is JSON-RPC error -32602 naming it", f"{describe(e)}")

        # -- resources and prompts ----------------------------------------------------------------
        await self.resources(node)
        await self.prompts()

    async def read_job_log(self, job_id: str | None) -> None:
        if not job_id:
            return
        try:
            r = await self.client.read_resource(f"rsim://job/{job_id}/log")
            text = "".join(getattr(x, "text", "") for x in r.contents)
            self.c.check("read resource rsim://job/{id}/log gives the training log", "step" in text, short(text))
        except Exception as e:  # noqa: BLE001
            self.c.fail("read resource rsim://job/{id}/log", f"{describe(e)}")

    async def cancel_flow(self, node: str) -> None:
        c = self.c
        reg = await self.good("register_dataset for the cancelled run", "register_dataset",
                              {"node": node, "name": f"{self.tag}-rev",
                               "source": {"kind": "arith", "op": "add", "digits": 2, "format": "reversed",
                                          "n": 200, "seed": 2}})
        if not reg:
            return
        sc = await self.good("run_sft of a very long job returns a running-job handle", "run_sft",
                             {"node": node, "base": "base", "datasets": [f"{self.tag}-rev"], "learning_rate": 0.001,
                              "steps": 10_000_000, "batch_size": 16})
        if not sc:
            return
        if not c.check("the long run_sft answers quickly with status running and a job id",
                       sc.get("status") == "running" and str(sc.get("job", "")).startswith("j-"), short(sc)):
            return
        job = sc["job"]
        await self.good("cancel_job", "cancel_job", {"job": job})
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            r = await self.call("get_job", {"job": job})
            if not r.is_error and isinstance(r.structured_content, dict):
                state = r.structured_content.get("job", {}).get("state")
                if state not in (None, "queued", "running"):
                    break
            await anyio.sleep(0.3)
        c.check("a cancelled job is recorded as cancelled", state == "cancelled", f"state={state}")

    async def resources(self, node: str | None) -> None:
        c = self.c
        try:
            listed = [str(r.uri) for r in (await self.client.list_resources()).resources]
            c.check("resources/list includes rsim://dag", "rsim://dag" in listed, short(listed))
            templates = [t.uri_template for t in (await self.client.list_resource_templates()).resource_templates]
            want = {"rsim://node/{id}", "rsim://node/{id}/actions/{seq}", "rsim://job/{id}/log"}
            c.check("resource templates for nodes, actions and job logs", want <= set(templates), short(templates))
            r = await self.client.read_resource("rsim://dag")
            dag = json.loads(r.contents[0].text)
            ids = [n.get("id") for n in dag.get("nodes", [])]
            c.check("read rsim://dag gives the DAG as JSON", "n0" in ids and (node in ids if node else True),
                    short(ids))
            if node:
                r = await self.client.read_resource(f"rsim://node/{node}")
                body = json.loads(r.contents[0].text)
                c.check("read rsim://node/{id} gives the node", body.get("id") == node, short(body))
                seq = body.get("actions", [{}])[-1].get("seq", 1)
                r = await self.client.read_resource(f"rsim://node/{node}/actions/{seq}")
                body = json.loads(r.contents[0].text)
                c.check("read rsim://node/{id}/actions/{seq} gives an action record",
                        isinstance(body, dict) and bool(body), short(body))
        except Exception as e:  # noqa: BLE001
            c.fail("resources", f"{describe(e)}")
        try:
            await self.client.read_resource("rsim://node/n999999")
            c.fail("reading an unknown node resource is an error", "no error")
        except MCPError as e:
            c.check("reading an unknown node resource is an error", "n999999" in e.message or e.code != 0,
                    e.message)
        except Exception as e:  # noqa: BLE001
            c.fail("reading an unknown node resource is an error", f"{describe(e)}")

    async def prompts(self) -> None:
        c = self.c
        try:
            names = {p.name for p in (await self.client.list_prompts()).prompts}
            c.check("prompts/list gives worker and reviewer", {"worker", "reviewer"} <= names, short(sorted(names)))
            p = await self.client.get_prompt("worker")
            text = " ".join(getattr(m.content, "text", "") for m in p.messages)
            c.check("prompts/get worker gives the role instructions", len(text) > 200, short(text))
        except Exception as e:  # noqa: BLE001
            c.fail("prompts", f"{describe(e)}")


def stdio_params(args: argparse.Namespace, role: str) -> StdioServerParameters:
    return StdioServerParameters(command=args.rsim,
                                 args=["mcp", "--study", args.study, "--role", role, "--agent", f"{args.tag}-{role}"])


async def role_checks(args: argparse.Namespace, c: Checks) -> None:
    """A reviewer and an observer, each in its own `rsim mcp` process over stdio, next to the main
    connection (which may be a running `rsim serve`)."""
    try:
        async with Client(stdio_params(args, "reviewer"), mode=args.mode, read_timeout_seconds=60) as rev:
            s = Session(rev, c, args)
            names = {t.name for t in (await rev.list_tools()).tools}
            want = ROLE_TOOLS["reviewer"]
            c.check("tools/list gives a reviewer exactly its tools", names == want,
                    f"missing {sorted(want - names)}, unexpected {sorted(names - want)}")
            nodes = (await s.good("reviewer lists nodes", "list_nodes", {"limit": 500})) or {}
            ids = [n["id"] for n in nodes.get("nodes", []) if n.get("id") != "n0"][:2]
            sc = await s.good("review by a reviewer", "review",
                              {"node": "n0", "summary": f"{args.tag}: plain vs reversed so far.",
                               "verdicts": [{"node": i, "verdict": "needs_more_seeds", "reason": "one seed only"}
                                            for i in ids],
                               "proposals": [{"parents": ["n0"], "title": f"{args.tag} scratchpad format"}]})
            if sc:
                c.check("review is recorded with a commit", len(sc.get("commit", "")) == 40, short(sc))
                lg = await s.good("log after the review", "log", {"node": "n0", "limit": 100})
                mine = [a for a in (lg or {}).get("actions", []) if a.get("commit") == sc.get("commit")]
                c.check("the review is recorded with the reviewer's identity and role",
                        len(mine) == 1 and mine[0].get("role") == "reviewer"
                        and mine[0].get("agent") == f"{args.tag}-reviewer", short(mine))
            await s.bad("reviewer calling run_sft (not its tool) is refused by rule `role`", "run_sft",
                        {"node": "n0", "base": "base", "datasets": ["x"], "learning_rate": 0.001, "steps": 1,
                         "batch_size": 1}, "role")
            p = await rev.get_prompt("reviewer")
            c.check("prompts/get reviewer gives the reviewer instructions",
                    len(" ".join(getattr(m.content, "text", "") for m in p.messages)) > 200, "short prompt")
    except Exception as e:  # noqa: BLE001
        c.fail("reviewer connection over stdio", f"{describe(e)}")
    try:
        async with Client(stdio_params(args, "observer"), mode=args.mode, read_timeout_seconds=60) as obs:
            s = Session(obs, c, args)
            tools = (await obs.list_tools()).tools
            names = {t.name for t in tools}
            c.check("tools/list gives an observer exactly the read-only tools",
                    names == ROLE_TOOLS["observer"] and all(t.annotations and t.annotations.read_only_hint
                                                           for t in tools), short(sorted(names)))
            await s.bad("observer calling a writer is refused by rule `role`", "branch",
                        {"parents": ["n0"], "title": "observer"}, "role")
            await s.bad("observer calling cancel_job is refused by rule `role`", "cancel_job",
                        {"job": "j-0123456789abcdef"}, "role")
            await s.good("observer can query", "get_node", {"node": "n0"})
    except Exception as e:  # noqa: BLE001
        c.fail("observer connection over stdio", f"{describe(e)}")


async def abandon_job(args: argparse.Namespace, c: Checks, server: Any, how: str) -> str | None:
    """Start a run_sft that answers at once (--job-wait 0) and disconnect the way the SDK does it
    (HTTP: end the session; stdio: close stdin, SIGTERM after 2 s, SIGKILL). Returns the job id."""
    async with Client(server, mode=args.mode, read_timeout_seconds=60) as a:
        s = Session(a, c, args)
        b = await s.good(f"branch for the job abandoned over {how}", "branch",
                         {"parents": ["n0"], "title": f"{args.tag} job abandoned over {how}"})
        if not b:
            return None
        name = f"{args.tag}-left-{how}"
        if not await s.good(f"register_dataset for the job abandoned over {how}", "register_dataset",
                            {"node": b["node"], "name": name,
                             "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain",
                                        "n": 200, "seed": 6}}):
            return None
        sc = await s.good(f"run_sft over {how} with --job-wait 0", "run_sft",
                          {"node": b["node"], "base": "base", "datasets": [name], "learning_rate": 0.001,
                           "steps": args.steps * 5, "batch_size": 16})
        if not sc or not c.check(f"run_sft over {how} with --job-wait 0 answers status running at once",
                                 sc.get("status") == "running", short(sc)):
            return None
        return str(sc["job"])


async def disconnect_checks(args: argparse.Namespace, c: Checks) -> None:
    """What a job survives (tests/MCP_CONTRACT.md, "Long jobs"): over HTTP it runs to the end and is
    recorded after its agent disconnects; over stdio, SDK clients kill their `rsim mcp` 2-4 s after
    closing stdin, so the job is stopped and recorded `lost`, and wait_job says so."""
    try:
        over_http = await abandon_job(args, c, args.url_nowait, "http") if args.url_nowait else None
        leaver = StdioServerParameters(command=args.rsim, args=["mcp", "--study", args.study, "--role", "worker",
                                                                "--agent", f"{args.tag}-leaver", "--job-wait", "0"])
        over_stdio = await abandon_job(args, c, leaver, "stdio")
        server: Any = args.url if args.url else stdio_params(args, "worker")
        async with Client(server, mode=args.mode, read_timeout_seconds=120) as other:
            s = Session(other, c, args)
            if over_http:
                # The job needs a few seconds; 45 s is ample even on a loaded machine.
                done = await s.good("another agent waits for the job abandoned over HTTP", "wait_job",
                                    {"job": over_http, "timeout_s": 45})
                if done:
                    record = done.get("job") if isinstance(done.get("job"), dict) else {}
                    c.check("a job outlives its HTTP agent's disconnect and is recorded as succeeded",
                            record.get("state") == "succeeded" and bool(done.get("checkpoint")), short(done))
        if over_stdio:
            # "Stopped and recorded lost by the next process that opens the study": open it anew.
            async with Client(stdio_params(args, "observer"), mode=args.mode, read_timeout_seconds=120) as nxt:
                await Session(nxt, c, args).bad("wait_job on the job abandoned over stdio says it was lost",
                                                "wait_job", {"job": over_stdio, "timeout_s": 45}, "lost")
    except Exception as e:  # noqa: BLE001
        c.fail("abandoned-job connections", describe(e))


async def task_checks(args: argparse.Namespace, c: Checks) -> None:
    """Protocol 2026-07-28 with the tasks extension declared: run_sft becomes an MCP task that the
    client polls with tasks/get; the task's result is the recorded run_sft result."""
    tasks = Tasks()
    server: Any = args.url if args.url else stdio_params(args, "worker")
    try:
        async with Client(server, mode=args.mode, extensions=[tasks], read_timeout_seconds=120) as client:
            s = Session(client, c, args)
            b = await s.good("branch for the task run", "branch", {"parents": ["n0"], "title": f"{args.tag} as a task"})
            if not b:
                return
            node = b["node"]
            name = f"{args.tag}-task"
            if not await s.good("register_dataset for the task run", "register_dataset",
                                {"node": node, "name": name,
                                 "source": {"kind": "arith", "op": "add", "digits": 2, "format": "plain",
                                            "n": 200, "seed": 5}}):
                return
            sc = await s.good("run_sft as an MCP task (tasks extension, polled with tasks/get)", "run_sft",
                              {"node": node, "base": "base", "datasets": [name], "learning_rate": 0.001,
                               "steps": 500, "batch_size": 8})
            c.check("the server answered run_sft with a task", len(tasks.created) == 1,
                    f"tasks created: {len(tasks.created)}")
            if sc:
                c.check("the task's result is the recorded run_sft result",
                        sc.get("job", {}).get("state") == "succeeded" and len(sc.get("checkpoint") or "") == 64
                        and tasks.statuses[-1:] == ["completed"], f"{short(sc)} statuses={tasks.statuses}")
            gq = await s.good("a query tool stays synchronous with tasks declared", "get_node", {"node": node})
            if gq:
                c.check("a query returns its result directly", gq.get("id") == node, short(gq))
    except Exception as e:  # noqa: BLE001
        c.fail("tasks-extension connection", f"{describe(e)}")


async def main_async(args: argparse.Namespace) -> Checks:
    label = f"python {args.mode} {'http' if args.url else 'stdio'}"
    c = Checks(label)
    server: Any = args.url if args.url else stdio_params(args, "worker")
    try:
        async with Client(server, mode=args.mode, read_timeout_seconds=120) as client:
            c.check("connect and negotiate", bool(client.protocol_version), "no protocol version")
            want = args.expect_version or ("2025-11-25" if args.mode == "legacy" else args.mode)
            c.check(f"negotiates protocol {want} (mode {args.mode})", client.protocol_version == want,
                    f"got {client.protocol_version}")
            caps = client.server_capabilities
            c.check("server declares tools, resources and prompts",
                    bool(caps.tools and caps.resources and caps.prompts), short(caps.model_dump(exclude_none=True)))
            await Session(client, c, args).run()
    except Exception as e:  # noqa: BLE001
        c.fail("session", f"{describe(e)}\n{traceback.format_exc()}")
    if args.roles:
        await role_checks(args, c)
        await disconnect_checks(args, c)
    if args.tasks:
        await task_checks(args, c)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    ap.add_argument("--url-nowait", help="the same study served with --job-wait 0 (a job abandoned over HTTP)")
    ap.add_argument("--rsim", required=True, help="rsim binary (stdio connections)")
    ap.add_argument("--study", required=True, help="study directory")
    ap.add_argument("--mode", default="legacy",
                    help="legacy (initialize), auto (server/discover, else initialize) or a modern protocol version")
    ap.add_argument("--expect-version", help="protocol version the connection must end up with")
    ap.add_argument("--tag", default="py", help="prefix for node titles (tells runs apart in the record)")
    ap.add_argument("--steps", type=int, default=4000, help="run_sft steps (long enough to report progress)")
    ap.add_argument("--roles", action="store_true", help="also run the reviewer and observer connections")
    ap.add_argument("--tasks", action="store_true", help="also run run_sft as an MCP task (2026-07-28)")
    args = ap.parse_args()
    c = anyio.run(main_async, args)
    print(f"RESULT passed={c.passed} failed={c.failed}", flush=True)
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
