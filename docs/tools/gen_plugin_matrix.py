"""Generate the support.yaml data files of the rocm, ascend and hpu plugins, and the CPU
plugin's support_vendor.yaml (the values and flags that need other hardware; the CPU plugin's own
support.yaml, kept by hand, lists what it implements and overrides these rows).

Inputs (the specification, kept beside the repository in ``../shared``):
  flags/server-flags.tsv                     every SGLang flag, with the Ascend page's A2/A3 verdicts
  seeds/sglang-ascend-npu-support-matrix.md  the Ascend page itself, for its listed option values

Rules:
  * Ascend: a flag the page marks unsupported (×) is ``unsupported`` on that generation; a flag it
    marks supported (√) is ``not-implemented`` in this generated layer; the plugin's hand-kept
    ``support_impl.yaml`` raises what it implements to ``experimental`` (``supported`` only once
    tested on Ascend hardware). Option values the page lists for a
    supported flag get their own flag=value rows with the same verdict.
  * ROCm and Gaudi: every flag is ``not-implemented`` (no kernels for them exist in infer).
  * Everywhere: option values that need another vendor's hardware (fa3 is an sm90 CUDA kernel,
    aiter is ROCm-only, ...) are ``unsupported`` with the reason.

Run from the repository root:  python docs/tools/gen_plugin_matrix.py [--shared ../shared]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PLATFORMS = {
    "rocm": {"generations": ["gfx942", "gfx950"], "vendor": "rocm",
             "missing": "infer-plugin-rocm has no ROCm kernels yet (attention, GEMM, MoE), so "
                        "infer cannot run this on ROCm"},
    "ascend": {"generations": ["A2", "A3"], "vendor": "ascend",
               "missing": "infer has no Ascend implementation yet"},
    "hpu": {"generations": ["gaudi2", "gaudi3"], "vendor": "hpu",
            "missing": "infer-plugin-hpu has no Gaudi kernels yet, so infer cannot run this on "
                       "Gaudi"},
}

CUDA_ONLY = "a CUDA kernel for NVIDIA GPUs"
# value -> (the vendor it needs, why). Keyed per flag; ``vendor`` is cuda, rocm, ascend or cpu.
VENDOR_VALUES: dict[str, dict[str, tuple[str, str]]] = {
    "--attention-backend": {
        "fa3": ("cuda", "FlashAttention-3 is an sm90 (Hopper) CUDA kernel"),
        "fa4": ("cuda", "FlashAttention-4 is a CUDA kernel for sm90/sm100"),
        "flashinfer": ("cuda", "FlashInfer is a CUDA-only library"),
        "flashmla": ("cuda", "FlashMLA is an sm90 CUDA kernel"),
        "cutlass_mla": ("cuda", "cutlass_mla is an sm100 (Blackwell) CUDA kernel"),
        "trtllm_mla": ("cuda", "trtllm_mla is an sm100-only CUDA kernel"),
        "trtllm_mha": ("cuda", "trtllm_mha is an sm100-only CUDA kernel"),
        "dual_chunk_flash_attn": ("cuda", f"dual-chunk flash attention is {CUDA_ONLY}"),
        "aiter": ("rocm", "aiter is AMD's ROCm kernel library"),
        "wave": ("rocm", "wave kernels target AMD GPUs only"),
        "intel_amx": ("cpu", "intel_amx runs on Intel CPUs with AMX"),
        "ascend": ("ascend", "the ascend backend needs an Ascend NPU"),
    },
    "--mm-attention-backend": {
        "fa3": ("cuda", "FlashAttention-3 is an sm90 (Hopper) CUDA kernel"),
        "fa4": ("cuda", "FlashAttention-4 is a CUDA kernel for sm90/sm100"),
        "ascend_attn": ("ascend", "ascend_attn needs an Ascend NPU"),
        "aiter_attn": ("rocm", "aiter_attn is AMD's ROCm kernel library"),
    },
    "--sampling-backend": {
        "flashinfer": ("cuda", "FlashInfer is a CUDA-only library"),
        "ascend": ("ascend", "the ascend sampler needs an Ascend NPU"),
    },
    "--fp8-gemm-backend": {
        "deep_gemm": ("cuda", "DeepGEMM is a CUDA kernel for sm90/sm100"),
        "flashinfer_trtllm": ("cuda", "FlashInfer is a CUDA-only library"),
        "cutlass": ("cuda", f"this CUTLASS GEMM is {CUDA_ONLY}"),
        "aiter": ("rocm", "aiter is AMD's ROCm kernel library"),
    },
    "--fp4-gemm-backend": {
        v: ("cuda", "FlashInfer is a CUDA-only library")
        for v in ("flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm")
    },
    "--moe-runner-backend": {
        "deep_gemm": ("cuda", "DeepGEMM is a CUDA kernel for sm90/sm100"),
        "cutlass": ("cuda", f"this CUTLASS MoE is {CUDA_ONLY}"),
        **{v: ("cuda", "FlashInfer is a CUDA-only library")
           for v in ("flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_mxfp4",
                     "flashinfer_cutedsl")},
    },
    "--moe-a2a-backend": {"ascend_fuseep": ("ascend", "ascend_fuseep needs Ascend NPUs")},
    "--lora-backend": {"ascend": ("ascend", "the ascend LoRA kernels need an Ascend NPU")},
    "--hicache-io-backend": {"kernel_ascend": ("ascend", "kernel_ascend needs an Ascend NPU")},
    "--disaggregation-transfer-backend": {"ascend": ("ascend", "the ascend transfer engine "
                                                               "needs Ascend NPUs")},
}
for _alias in ("--prefill-attention-backend", "--decode-attention-backend",
               "--speculative-draft-attention-backend"):
    VENDOR_VALUES[_alias] = VENDOR_VALUES["--attention-backend"]

# Flags whose whole purpose is another vendor's hardware or library.
VENDOR_FLAGS: dict[str, tuple[str, str]] = {
    "--enable-nccl-nvls": ("cuda", "NVLink SHARP needs NVIDIA NVSwitch hardware"),
    "--enable-layerwise-nvtx-marker": ("cuda", "NVTX markers are NVIDIA's profiling tool"),
    "--disable-flashinfer-autotune": ("cuda", "FlashInfer is a CUDA-only library"),
    "--flashinfer-mla-disable-ragged": ("cuda", "FlashInfer is a CUDA-only library"),
    "--enable-flashinfer-allreduce-fusion": ("cuda", "FlashInfer is a CUDA-only library"),
    "--flashinfer-mxfp4-moe-precision": ("cuda", "FlashInfer is a CUDA-only library"),
    "--disable-flashinfer-cutlass-moe-fp4-allgather": ("cuda", "FlashInfer is a CUDA-only library"),
    "--enable-flashinfer-cutlass-moe": ("cuda", "FlashInfer is a CUDA-only library"),
    "--enable-flashinfer-cutedsl-moe": ("cuda", "FlashInfer is a CUDA-only library"),
    "--enable-flashinfer-trtllm-moe": ("cuda", "FlashInfer is a CUDA-only library"),
    "--enable-flashinfer-mxfp4-moe": ("cuda", "FlashInfer is a CUDA-only library"),
}

PAGE_GENS = ("A2", "A3")


def read_flags(tsv: Path) -> list[dict[str, str]]:
    with tsv.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _verdict(cell: str) -> bool | None:
    if "√" in cell:
        return True
    if "×" in cell:
        return False
    return None


def read_page(md: Path) -> dict[str, dict]:
    """flag name (and aliases) -> {"A2": bool, "A3": bool, "options": [values]} from the page."""
    out: dict[str, dict] = {}
    for line in md.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`(--[^`]+)`", cells[0])
        a2, a3 = _verdict(cells[-2]), _verdict(cells[-1])
        options: list[str] = []
        if len(cells) == 6 and not re.match(r"(Type|List|Optional|JSON|N/A|bool|Bool)", cells[3]):
            options = re.findall(r"`([^`]+)`", cells[3]) or re.findall(r"'([^']+)'", cells[3])
        for n in names:
            out[n] = {"A2": a2, "A3": a3, "options": options}
    return out


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _row(flag: str, status: str, reason: str, value: str | None = None,
         gens: list[str] | None = None) -> str:
    parts = [f"flag: {flag}"]
    if value is not None:
        parts.append(f"value: {_q(value)}")
    parts.append(f"status: {status}")
    if gens:
        parts.append(f"generations: [{', '.join(gens)}]")
    parts.append(f"reason: {_q(reason)}")
    return "  - {" + ", ".join(parts) + "}"


def _vendor_rows(platform: str, flag: str, skip_values: set[str]) -> list[str]:
    rows = []
    vendor = PLATFORMS[platform]["vendor"]
    for value, (needs, why) in VENDOR_VALUES.get(flag, {}).items():
        if needs != vendor and value not in skip_values:
            rows.append(_row(flag, "unsupported", f"{why}; it cannot run on this hardware", value))
    return rows


def ascend_rows(flags: list[dict[str, str]], page: dict[str, dict]) -> list[str]:
    missing = PLATFORMS["ascend"]["missing"]
    rows = []
    for rec in flags:
        flag = rec["flag"]
        verdicts = {"A2": rec["ascend_a2"], "A3": rec["ascend_a3"]}
        hit = page.get(flag) or next(
            (page[a] for a in rec["aliases"].split(",") if a.strip() in page), None)
        per_gen: dict[str, tuple[str, str]] = {}
        for gen, v in verdicts.items():
            if v == "no":
                per_gen[gen] = ("unsupported",
                                f"not supported on {gen} per the Ascend support page")
            elif v == "yes":
                per_gen[gen] = ("not-implemented",
                                f"supported on {gen} per the Ascend support page; {missing}")
            elif flag in VENDOR_FLAGS:
                per_gen[gen] = ("unsupported",
                                f"{VENDOR_FLAGS[flag][1]}; it cannot run on this hardware")
            else:
                per_gen[gen] = ("not-implemented",
                                f"not listed on the Ascend support page; {missing}")
        if per_gen["A2"][0] == per_gen["A3"][0] and verdicts["A2"] == verdicts["A3"]:
            status, reason = per_gen["A2"]
            rows.append(_row(flag, status, reason.replace("on A2 ", "on A2/A3 ")))
        else:
            for gen in PAGE_GENS:
                rows.append(_row(flag, *per_gen[gen], gens=[gen]))
        listed = set(hit["options"]) if hit else set()
        supported_gens = [g for g in PAGE_GENS if verdicts[g] == "yes"]
        for value in (hit["options"] if hit else []):
            if supported_gens:
                gens_txt = "/".join(supported_gens)
                rows.append(_row(flag, "not-implemented",
                                 f"listed as supported on {gens_txt} by the Ascend support page; "
                                 f"{missing}", value,
                                 None if len(supported_gens) == 2 else supported_gens))
        rows += _vendor_rows("ascend", flag, listed)
    return rows


def other_rows(platform: str, flags: list[dict[str, str]]) -> list[str]:
    missing = PLATFORMS[platform]["missing"]
    rows = []
    for rec in flags:
        flag = rec["flag"]
        if flag in VENDOR_FLAGS and VENDOR_FLAGS[flag][0] != PLATFORMS[platform]["vendor"]:
            rows.append(_row(flag, "unsupported",
                             f"{VENDOR_FLAGS[flag][1]}; it cannot run on this hardware"))
        else:
            rows.append(_row(flag, "not-implemented", missing))
        rows += _vendor_rows(platform, flag, set())
    return rows


CPU_GENERATIONS = ["amx", "avx512", "avx2", "arm", "x86_64"]
# Flags about CUDA graph capture sizes: the CPU's native decode graph takes any batch size.
CPU_GRAPH_FLAGS = ("--cuda-graph-max-bs", "--cuda-graph-bs", "--disable-cuda-graph-padding",
                   "--enable-cudagraph-gc", "--enable-profile-cuda-graph")


def cpu_vendor_rows(flags: list[dict[str, str]]) -> list[str]:
    """Rows for the CPU plugin: what needs a GPU/NPU, and the flags about graph capture."""
    known = {rec["flag"] for rec in flags}
    rows = []
    for flag, (_, why) in VENDOR_FLAGS.items():
        if flag in known:
            rows.append(_row(flag, "unsupported", f"{why}; it cannot run on a CPU"))
    for flag in CPU_GRAPH_FLAGS:
        if flag in known:
            rows.append(_row(flag, "unsupported",
                             "CUDA graphs need an NVIDIA GPU; the CPU's native decode graph "
                             "(infer_cpu.graph) runs any batch size, with no capture sizes or padding"))
    if "--disable-cuda-graph" in known:
        rows.append("  - {flag: --disable-cuda-graph, status: supported, reason: "
                    "\"turns off the CPU's native decode graph (infer_cpu.graph): decode steps run "
                    "op by op from Python\"}")
    for flag in VENDOR_VALUES:
        for value, (needs, why) in VENDOR_VALUES[flag].items():
            if needs != "cpu":
                rows.append(_row(flag, "unsupported", f"{why}; it cannot run on a CPU", value))
            else:  # a CPU kernel for other CPUs (intel_amx): the ISA decides
                rows.append(_row(flag, "unsupported", f"{why}; this CPU generation lacks it",
                                 value, [g for g in CPU_GENERATIONS if g != "amx"]))
    return rows


def render_cpu_vendor(rows: list[str]) -> str:
    head = [
        "# Generated by docs/tools/gen_plugin_matrix.py: values and flags that need other",
        "# hardware. The hand-kept support.yaml beside it lists what the CPU plugin implements",
        "# and is registered after this file, so its rows win.",
        "platform: cpu",
        f"generations: [{', '.join(CPU_GENERATIONS)}]",
        "include_core: false",
        "entries:",
    ]
    return "\n".join(head + rows) + "\n"


def render(platform: str, rows: list[str]) -> str:
    gens = PLATFORMS[platform]["generations"]
    head = [
        "# Generated by docs/tools/gen_plugin_matrix.py from ../shared/flags/server-flags.tsv",
        "# (and the Ascend support page); edit the script, not this file. Flip a row to",
        "# supported only when the feature is implemented and tested on this platform.",
        f"platform: {platform}",
        f"generations: [{', '.join(gens)}]",
        "include_core: false",
        "entries:",
    ]
    return "\n".join(head + rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    args = ap.parse_args()
    flags = read_flags(args.shared / "flags" / "server-flags.tsv")
    page = read_page(args.shared / "seeds" / "sglang-ascend-npu-support-matrix.md")
    outputs = {
        "ascend": ascend_rows(flags, page),
        "rocm": other_rows("rocm", flags),
        "hpu": other_rows("hpu", flags),
    }
    for platform, rows in outputs.items():
        path = REPO / "plugins" / platform / f"infer_{platform}" / "support.yaml"
        path.write_text(render(platform, rows))
        print(f"wrote {path.relative_to(REPO)}: {len(rows)} rows")
    cpu_rows = cpu_vendor_rows(flags)
    path = REPO / "plugins" / "cpu" / "infer_cpu" / "support_vendor.yaml"
    path.write_text(render_cpu_vendor(cpu_rows))
    print(f"wrote {path.relative_to(REPO)}: {len(cpu_rows)} rows")


if __name__ == "__main__":
    main()
