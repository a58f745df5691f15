"""Renders chat templates as transformers' apply_chat_template does.

Reads JSON from stdin: {"now": unix_seconds, "jobs": [{"template", "bos",
"eos", "messages", "add_generation_prompt", "tools"}]}; writes a JSON list of
{"ok": text} or {"err": message}. Mirrors transformers' _compile_jinja_template
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
AssistantTracker's {% generation %}, raise_exception, strftime_now, tojson).
"""
import json
import sys
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

req = json.load(sys.stdin)
NOW = req["now"]


class AssistantTracker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.fromtimestamp(NOW, timezone.utc).strftime(fmt)


env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

out = []
for job in req["jobs"]:
    try:
        kwargs = {}
        if job.get("bos") is not None:
            kwargs["bos_token"] = job["bos"]
        if job.get("eos") is not None:
            kwargs["eos_token"] = job["eos"]
        text = env.from_string(job["template"]).render(
            messages=job["messages"],
            tools=job.get("tools"),
            add_generation_prompt=job["add_generation_prompt"],
            **kwargs,
        )
        out.append({"ok": text})
    except Exception as e:  # noqa: BLE001 - report any failure to the caller
        out.append({"err": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
