"""Generate ``core/config/flags.json`` (the server-flag table) from the SGLang seed pages.

A development tool, not part of the installed package: it reads ``../shared`` (the seeds, kept
beside the repository); the package only reads the JSON it writes. Run from the repository root::

    python docs/tools/gen_flags.py [--shared ../shared]

Sources: ``flags/server-flags.tsv`` gives the 336 flags, their sections and aliases;
``seeds/sglang-server-arguments-latest.txt`` (primary) gives description, default and options;
``seeds/sglang-v0.5.2-server_args.py.txt`` disambiguates defaults that the flattened page glues to
the description. The few rows the page leaves ambiguous are fixed in ``OVERRIDES`` below.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "core" / "config" / "flags.json"

# SGLang's dest names where they differ from the flag name (server_args.from_cli_args).
DEST_OVERRIDES = {
    "--tensor-parallel-size": "tp_size",
    "--pipeline-parallel-size": "pp_size",
    "--data-parallel-size": "dp_size",
    "--expert-parallel-size": "ep_size",
}

# Rows the flattened page leaves ambiguous (default glued to a description ending in a word).
OVERRIDES: dict[str, dict[str, Any]] = {
    "--torchao-config": {"default": ""},
    "--tokenizer-metrics-custom-labels-header": {"default": "x-custom-labels"},
    "--otlp-traces-endpoint": {"default": "localhost:4317"},
    "--kt-method": {"default": "AMXINT4"},
    "--debug-tensor-dump-inject": {"type": "bool", "default": False, "action": "store_true"},
    "--crash-on-nan": {"type": "bool", "default": False, "action": "store_true"},
    "--max-queued-requests": {"default": None},
    "--mm-per-request-timeout": {"type": "float"},
    "--lora-target-modules": {"type": "list[str]", "nargs": "*"},
    # infer's platforms are plugins (cpu, cuda, rocm, ascend, hpu, or a third party's): open values
    "--device": {"help": "The device platform to use: cpu, cuda, rocm, ascend, hpu (or another "
                         "installed plugin's platform), or auto. Defaults to auto-detection (the single "
                         "accelerator found, else cpu); INFER_DEVICE also sets it."},
}

# What each deprecated flag maps to (from the seed page and server_args.__post_init__).
DEPRECATED: dict[str, dict[str, Any]] = {
    "--enable-ep-moe": {"set": {"ep_size": "@tp_size"}},
    "--enable-deepep-moe": {"set": {"moe_a2a_backend": "deepep"}},
    "--enable-flashinfer-cutlass-moe": {"set": {"moe_runner_backend": "flashinfer_cutlass"}},
    "--enable-flashinfer-cutedsl-moe": {"set": {"moe_runner_backend": "flashinfer_cutedsl"}},
    "--enable-flashinfer-trtllm-moe": {"set": {"moe_runner_backend": "flashinfer_trtllm"}},
    "--enable-triton-kernel-moe": {"set": {"moe_runner_backend": "triton_kernel"}},
    "--enable-flashinfer-mxfp4-moe": {"set": {"moe_runner_backend": "flashinfer_mxfp4"}},
    "--nsa-prefill": {"set": {"nsa_prefill_backend": "@value"}},
    "--nsa-decode": {"set": {"nsa_decode_backend": "@value"}},
    "--prefill-round-robin-balance": {"set": {}},
    "--crash-on-nan": {"set": {}},
    "--hybrid-kvcache-ratio": {"set": {}},
    "--load-watch-interval": {"set": {}},
}

TOKEN = re.compile(r"^[\w\-]+$")


# Flags on the seed page that the inventory lists no row for: kept, placed after a neighbour.
EXTRA_PAGE_FLAGS = [("Logging", "--log-requests-level", "--log-requests"),
                    ("Model override args", "--preferred-sampling-params", "--json-model-override-args")]


def read_tsv(shared: Path) -> list[dict[str, Any]]:
    rows = []
    with open(shared / "flags" / "server-flags.tsv") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            aliases = [a for a in re.split(r"[,\s]+", row["aliases"] or "") if a]
            rows.append({"section": row["section"], "flag": row["flag"], "aliases": aliases})
    for section, flag, after in EXTRA_PAGE_FLAGS:
        at = next(i for i, r in enumerate(rows) if r["flag"] == after) + 1
        rows.insert(at, {"section": section, "flag": flag, "aliases": [], "extra": True})
    return rows


def read_page(shared: Path, names: set[str]) -> dict[str, str]:
    """flag (any of its names) -> the row text after the names."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in (shared / "seeds" / "sglang-server-arguments-latest.txt").read_text().splitlines():
        if not line.startswith("--"):
            pending = []
            continue
        name = max((n for n in names if line.startswith(n) and not line[len(n):].startswith("-")),
                   key=len, default=None)
        if name is None:  # a spelling the inventory does not list (e.g. "--ep"): stop at a capital
            m = re.match(r"--[a-z0-9]+(?:-[a-z0-9]+)*", line)
            if m is None:
                continue
            name = m.group(0)
        rest = line[len(name):]
        if not rest.strip():
            pending.append(name)
            continue
        for n in [*pending, name]:
            out.setdefault(n, rest)
        pending = []
    return out


def read_v052(shared: Path) -> dict[str, Any]:
    """dest -> default, from the dataclass body of the v0.5.2 server_args.py."""
    text = (shared / "seeds" / "sglang-v0.5.2-server_args.py.txt").read_text()
    body = text[text.index("class ServerArgs"):text.index("def __post_init__")]
    out = {}
    for m in re.finditer(r"^(\w+): [^=\n]+= (.+)$", body, re.M):
        try:
            out[m.group(1)] = ast.literal_eval(m.group(2).split("#")[0].strip())
        except (ValueError, SyntaxError):
            continue
    return out


def literal(text: str) -> Any:
    return {"None": None, "False": False, "True": True, '""': "", "{}": "{}", "[]": []}.get(
        text, text)


def split_choices(text: str) -> tuple[str, str, list[str]] | None:
    """'<desc><default><c1>, c2, ..., cn' -> (desc, default, [c1..cn]) or None."""
    items = text.split(", ")
    if len(items) < 2:
        return None
    i = len(items) - 1
    while i > 0 and TOKEN.match(items[i]):
        i -= 1
    if i == 0 and TOKEN.match(items[0]):
        return None
    glued, rest = items[i], items[i + 1:]
    if not rest:
        return None
    lead = ", ".join(items[:i]) + ", " if i else ""  # description text before the glued item
    # default == c1: the glued item ends with t+t
    for n in range(len(glued) // 2, 0, -1):
        t = glued[-n:]
        if TOKEN.match(t) and glued.endswith(t + t) and (n >= 2 or len(glued) == 2):
            return lead + glued[:-2 * n], t, [t, *rest]
    for d in ["None", *rest]:
        for n in range(len(glued) - len(d) - 1, 0, -1):
            head, c1 = glued[:len(glued) - n], glued[len(glued) - n:]
            if head.endswith(d) and TOKEN.match(c1):
                return lead + head[:-len(d)], d, [c1, *rest]
    return None


NUM = re.compile(r"(-?\d+\.\d+|-?\d+)$")
WORD_DEFAULT = re.compile(r"(None|False|True|\"\"|\{\}|\[\])$")


def split_default(text: str, dest: str, v052: dict[str, Any]) -> tuple[str, Any]:
    if dest in v052:
        d = v052[dest]
        for cand in ([str(d)] if d is not None else ["None"]) + (['""'] if d == "" else []):
            if text.endswith(cand):
                return text[:len(text) - len(cand)], literal(cand) if cand in ("None", '""') else d
    m = WORD_DEFAULT.search(text)
    if m:
        return text[:m.start()], literal(m.group(1))
    m = NUM.search(text)
    if m:
        s = m.group(1)
        return text[:m.start()], float(s) if "." in s else int(s)
    return text, "?"


def parse_row(flag: str, dest: str, text: str, v052: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "str", "choices": None, "nargs": None, "action": None}
    choices_ref = None
    m = re.search(r"[Bb]ool flag \(set to enable\)$", text)
    if m:
        rec.update(type="bool", action="store_true")
        body = text[:m.start()]
    elif text.endswith("N/A"):
        rec.update(type="bool", action="store_true")
        body = text[:-3]
    elif (m := re.search(r"Same as [—\-]*([\w \-]+?) options$", text)):
        ref = m.group(1).strip().replace(" ", "-")
        choices_ref = ref if ref.startswith("--") else "--" + ref
        body = text[:m.start()]
    elif (m := re.search(r"(?:Type: )?(Optional\[float\]|List\[(str|int|float)\])$", text)):
        rec["type"] = "float" if m.group(1).startswith("Optional") else f"list[{m.group(2)}]"
        rec["nargs"] = "*" if rec["type"].startswith("list") else None
        body = text[:m.start()]
    elif (m := re.search(r"Type: (.+)$", text)):
        t = m.group(1).strip()
        body = text[:m.start()]
        if t.startswith("List[str]"):
            rec.update(type="list[str]", nargs="*")
        elif t.startswith("JSON"):
            rec["type"] = "json"
        elif t.startswith("Optional[str]"):
            rec["type"] = "str"
        else:
            rec["type"] = {"str": "str", "int": "int", "float": "float"}[t]
    else:
        parts = split_choices(text)
        if parts is None and text.endswith("fsdp"):
            parts = (text[:-len("Nonefsdp")], None, ["fsdp"])
        if parts is None:
            raise SystemExit(f"cannot parse options of {flag}: {text[-120:]!r}")
        desc, default, choices = parts
        if all(re.fullmatch(r"-?\d+", c) for c in choices):
            rec["type"] = "int"
            choices = [int(c) for c in choices]
            default = int(default) if default not in (None, "None") else None
        rec["choices"] = choices
        rec["help"] = desc.strip()
        rec["default"] = literal(default) if isinstance(default, str) else default
        if dest in v052 and rec["default"] in ("None", None) and v052[dest] is None:
            rec["default"] = None
        return rec
    desc, default = split_default(body, dest, v052)
    if rec["type"] == "bool":
        default = None if default is None else bool(default)
    rec["help"] = desc.strip()
    rec["default"] = default
    if choices_ref:
        rec["choices_ref"] = choices_ref
    return rec


def build(shared: Path) -> list[dict[str, Any]]:
    rows = read_tsv(shared)
    names = {n for r in rows for n in [r["flag"], *r["aliases"]]}
    page = read_page(shared, names)
    v052 = read_v052(shared)
    table = []
    for r in rows:
        flag = r["flag"]
        dest = DEST_OVERRIDES.get(flag, flag[2:].replace("-", "_"))
        text = page.get(flag)
        if text is None:
            raise SystemExit(f"{flag} is not on the seed page")
        rec = {"section": r["section"], "flag": flag, "aliases": r["aliases"], "dest": dest,
               **parse_row(flag, dest, text, v052)}
        if r.get("extra"):
            rec["not_in_inventory"] = True
        over = OVERRIDES.get(flag, {})
        rec.update(over)
        d = over.get("default")
        if isinstance(d, str) and d:  # the parser may have split a glued default: strip its head
            for k in range(len(d), 2, -1):
                if rec["help"].endswith(d[:k]):
                    rec["help"] = rec["help"][:-k].strip()
                    break
        if rec["type"] == "json" and isinstance(rec["default"], str):
            rec["default"] = json.loads(rec["default"])
        if flag in DEPRECATED:
            rec["deprecated"] = DEPRECATED[flag]
        if rec["default"] == "?":
            raise SystemExit(f"cannot find the default of {flag}: {text[-100:]!r}")
        table.append(rec)
    by_flag = {t["flag"]: t for t in table}
    for t in table:  # "Same as --x options" takes --x's choices
        ref = t.pop("choices_ref", None)
        if ref:
            target = by_flag.get(ref) or by_flag.get(ref.replace("-options", ""))
            if target is None:
                alias = {"--attention-backend": "--attention-backend"}.get(ref, ref)
                target = by_flag.get(alias)
            if target is None:
                raise SystemExit(f"{t['flag']}: unknown choices reference {ref}")
            t["choices"] = target["choices"]
    return table


def render(table: list[dict[str, Any]]) -> str:
    """The committed text of flags.json: one list of flag records, in the inventory's order."""
    return json.dumps(table, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("--out", default=str(OUT))
    ns = ap.parse_args()
    table = build(Path(ns.shared))
    Path(ns.out).write_text(render(table), encoding="utf-8")
    print(f"wrote {len(table)} flags to {ns.out}")


if __name__ == "__main__":
    main()
