"""ptxas's resource report for `make cuda-check`: registers, stack, spills and shared memory
of every CUDA kernel, per arch, and the gate that fails on any spill.

    ptxas_resources.py [--checked FILE] [--nvcc NVCC] OUT_DIR REPORT...

A REPORT is what `nvcc -Xptxas -v` (or `--resource-usage`) wrote to stderr while compiling
one source for every arch of its -gencode list (mk/cuda-check.mk keeps it beside the object,
`<source>.ptxas`). ptxas compiles each arch in a run of its own and, per function, writes

    ptxas info    : 0 bytes gmem                                  (a run begins)
    ptxas info    : Compiling entry function '_Z5tightPfi' for 'sm_80'
    ptxas info    : Function properties for _Z5tightPfi
        528 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 128 bytes smem, 364 bytes cmem[0]

A `__noinline__` device function has a `Function properties` block and no `Compiling` line:
it takes the arch of its run. Other lines (compile times, warnings) are passed over.

Writes into OUT_DIR:

- resources.json: {"nvcc": ..., "functions": [one record per function and arch]};
- resources.tsv: the same records, one a line, with a header;
- resources.md: the compact table, a row per kernel (its template instantiations together:
  the range of their registers, the most of their stack, spills and shared memory), the
  archs side by side.

Prints the table. Exits 1 when any function spills (spill stores or loads > 0 bytes, any
arch), naming each with its arch and bytes, or when the reports name no kernel at all (then
they were not compiled with -Xptxas -v). With --checked FILE, writes its one-line summary
into FILE on success (the make target).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, fields

_INFO = re.compile(r"^ptxas info\s*:\s*(.*)$")
_RUN = re.compile(r"\d+ bytes gmem")
_COMPILING = re.compile(r"Compiling (entry )?function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = {
    "registers": re.compile(r"Used (\d+) registers"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "smem": re.compile(r"(\d+) bytes smem"),
}
# Itanium `<length><identifier>`, for the fallback short form of a mangled name.
_LENGTH = re.compile(r"(\d+)")


@dataclass
class Function:
    """One function as ptxas compiled it for one arch (sizes in bytes)."""

    source: str  # the source file, as the report's file name gives it
    arch: str  # "sm_80"
    mangled: str
    entry: bool  # a kernel (__global__); False: a device function not inlined
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    registers: int | None = None  # ptxas gives them for kernels only
    barriers: int | None = None
    smem: int = 0
    name: str = ""  # demangled, or the mangled name where no demangler is found
    short: str = ""  # the name without namespaces, return type and parameters

    @property
    def spills(self):
        return self.spill_stores + self.spill_loads > 0


class ReportError(Exception):
    """A report that cannot be read as ptxas's output."""


def parse(lines, source):
    """The functions of one source's report, in the report's order.

    Args:
        lines: the report's lines (ptxas -v's stderr, other lines mixed in).
        source: the source file named in each record.

    Returns:
        list[Function], `name` and `short` left empty (see `name_functions`).

    Raises:
        ReportError: a function whose arch cannot be told (a run names no kernel), or a
            `Function properties` line without its stack and spill line.
    """
    functions = []
    run = []  # the functions of the current ptxas run (one arch)
    run_arch = None
    current = None  # the function the next properties / Used lines describe
    expect_frame = None

    def close_run():
        nonlocal run, run_arch
        for f in run:
            if not f.arch:
                if run_arch is None:
                    raise ReportError(
                        f"{source}: ptxas reported {f.mangled} in a run that names no arch"
                    )
                f.arch = run_arch
        functions.extend(run)
        run, run_arch = [], None

    for raw in lines:
        line = raw.rstrip("\n")
        if expect_frame is not None:
            frame = _FRAME.search(line)
            if frame is None:
                raise ReportError(
                    f"{source}: no stack and spill line after the properties of "
                    f"{expect_frame.mangled}: {line!r}"
                )
            expect_frame.stack_frame, expect_frame.spill_stores, expect_frame.spill_loads = (
                int(v) for v in frame.groups()
            )
            expect_frame = None
            continue
        info = _INFO.match(line)
        if info is None:
            continue
        text = info.group(1)
        if _RUN.match(text):
            close_run()
            current = None
            continue
        compiling = _COMPILING.match(text)
        if compiling:
            is_entry, mangled, arch = compiling.groups()
            if run_arch is not None and arch != run_arch:
                close_run()  # a report without the `bytes gmem` line between runs
            run_arch = arch
            current = Function(source, arch, mangled, entry=bool(is_entry))
            run.append(current)
            continue
        properties = _PROPERTIES.match(text)
        if properties:
            mangled = properties.group(1)
            if current is None or current.mangled != mangled:
                current = Function(source, "", mangled, entry=False)
                run.append(current)
            expect_frame = current
            continue
        if text.startswith("Used ") and current is not None:
            for key, pattern in _USED.items():
                found = pattern.search(text)
                if found:
                    setattr(current, key, int(found.group(1)))
    if expect_frame is not None:
        raise ReportError(f"{source}: the report ends inside the properties of {expect_frame}")
    close_run()
    return functions


def _demangler():
    for tool in ("cu++filt", "c++filt"):
        path = shutil.which(tool)
        if path:
            return path
    return None


def demangle(names, demangler=None):
    """Demangled names, in order; each name kept as it is where no demangler runs."""
    demangler = demangler if demangler is not None else _demangler()
    if not names or not demangler:
        return list(names)
    try:
        out = subprocess.run(
            [demangler], input="\n".join(names) + "\n", capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)
    return out if len(out) == len(names) else list(names)


def _top_level(text, opening, closing):
    """The positions of `text`'s characters that sit at bracket depth 0."""
    depth, at_top = 0, []
    for i, c in enumerate(text):
        if c in closing:
            depth -= 1
        if depth == 0:
            at_top.append(i)
        if c in opening:
            depth += 1
    return at_top


def short_name(name):
    """A readable short form: `void ns::(anonymous namespace)::k<16u, ns::T<float> >(args)`
    gives `k<16u, T<float>>`; a mangled name gives its last identifier (`_Z5tightPfi`:
    `tight`)."""
    if name.startswith("_Z"):
        # <length><identifier> runs; the function's name is the last before its template
        # arguments or parameters (what cannot be read stays as it is).
        rest, parts = name[2:].lstrip("NKLV"), []
        while True:
            length = _LENGTH.match(rest)
            if not length:
                break
            n, start = int(length.group(1)), length.end()
            parts.append(rest[start : start + n])
            rest = rest[start + n :]
        return parts[-1] if parts else name
    top = _top_level(name, "<({[", ">)}]")
    # The parameters: the last top-level parenthesis; the return type: up to the last
    # top-level space before the name.
    opens = [i for i in top if name[i] == "(" and i > 0]
    end = opens[-1] if opens else len(name)
    spaces = [i for i in top if name[i] == " " and i < end]
    begin = spaces[-1] + 1 if spaces else 0
    short = name[begin:end]
    short = short.replace("(anonymous namespace)::", "")
    short = re.sub(r"\b[A-Za-z_]\w*::", "", short)
    return short.replace(" >", ">")


def name_functions(functions, demangler=None):
    """Fills each function's `name` (demangled by `demangler`, else cu++filt or c++filt
    where found, else the mangled name) and `short` (`short_name`)."""
    mangled = sorted({f.mangled for f in functions})
    by_mangled = dict(zip(mangled, demangle(mangled, demangler), strict=True))
    for f in functions:
        f.name = by_mangled[f.mangled]
        f.short = short_name(f.name)


def _template(short):
    return short.split("<", 1)[0]


def kernel_rows(functions):
    """The compact table's rows: per source and kernel (template instantiations together) and
    per arch, the range of registers and the most stack, spill and shared memory bytes."""
    archs = sorted({f.arch for f in functions}, key=lambda a: (len(a), a))
    rows = {}
    for f in functions:
        key = (os.path.basename(f.source), _template(f.short) + ("" if f.entry else " (device)"))
        row = rows.setdefault(key, {"instances": set(), "archs": {}})
        row["instances"].add(f.mangled)
        cell = row["archs"].setdefault(
            f.arch, {"registers": [], "stack": 0, "spill": [0, 0], "smem": 0}
        )
        if f.registers is not None:
            cell["registers"].append(f.registers)
        cell["stack"] = max(cell["stack"], f.stack_frame)
        cell["spill"] = [
            max(cell["spill"][0], f.spill_stores),
            max(cell["spill"][1], f.spill_loads),
        ]
        cell["smem"] = max(cell["smem"], f.smem)
    return archs, rows


def table(functions):
    """The compact markdown table (see `kernel_rows`)."""
    archs, rows = kernel_rows(functions)

    def per_arch(row, show):
        cells = [row["archs"].get(a) for a in archs]
        return " / ".join("-" if c is None else show(c) for c in cells)

    def registers(c):
        r = c["registers"]
        if not r:
            return "-"
        return str(r[0]) if min(r) == max(r) else f"{min(r)}-{max(r)}"

    def spills(c):
        return "{}+{}".format(*c["spill"])

    header = " / ".join(archs)
    lines = [
        f"| file | kernel | n | registers ({header}) | stack bytes | spill bytes st+ld | "
        "shared bytes |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for (source, kernel), row in sorted(rows.items()):
        lines.append(
            f"| {source} | `{kernel}` | {len(row['instances'])} | {per_arch(row, registers)} | "
            f"{per_arch(row, lambda c: str(c['stack']))} | "
            f"{per_arch(row, spills)} | "
            f"{per_arch(row, lambda c: str(c['smem']))} |"
        )
    return "\n".join(lines)


def spill_errors(functions):
    """One message per function that spills, naming it, its arch and its bytes."""
    return [
        f"cuda-check: {f.short} spills on {f.arch}: {f.spill_stores} bytes spill stores, "
        f"{f.spill_loads} bytes spill loads ({f.source}; {f.name})"
        for f in functions
        if f.spills
    ]


def summary(functions, out_dir):
    kernels = [f for f in functions if f.entry]
    archs = sorted({f.arch for f in functions})
    most = max(kernels, key=lambda f: (f.registers or 0, f.arch))
    smem = max(kernels, key=lambda f: (f.smem, f.arch))
    count = len({f.mangled for f in kernels})
    return (
        f"cuda-check: ptxas: {count} kernels, each for {' and '.join(archs)}: 0 spill bytes; at most "
        f"{most.registers} registers ({most.short}, {most.arch}), {smem.smem} bytes shared "
        f"memory ({smem.short}, {smem.arch}); table in {out_dir}/resources.md"
    )


def nvcc_version(nvcc):
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-2].strip() if len(lines) >= 2 else None


def write_reports(functions, out_dir, nvcc=None):
    os.makedirs(out_dir, exist_ok=True)
    records = [asdict(f) for f in functions]
    with open(os.path.join(out_dir, "resources.json"), "w") as f:
        json.dump({"nvcc": nvcc, "functions": records}, f, indent=1)
        f.write("\n")
    columns = [field.name for field in fields(Function)]
    with open(os.path.join(out_dir, "resources.tsv"), "w") as f:
        f.write("\t".join(columns) + "\n")
        for r in records:
            f.write("\t".join("" if r[c] is None else str(r[c]) for c in columns) + "\n")
    text = table(functions)
    with open(os.path.join(out_dir, "resources.md"), "w") as f:
        if nvcc:
            f.write(
                f"ptxas resources ({nvcc}); per arch: "
                + ", ".join(sorted({fn.arch for fn in functions}))
                + "\n\n"
            )
        f.write(text + "\n")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checked", help="write the one-line summary here on success")
    parser.add_argument("--nvcc", help="the nvcc that compiled, for its version")
    parser.add_argument("out_dir")
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args(argv)
    if args.checked and os.path.exists(args.checked):
        os.remove(args.checked)  # a failing check leaves no earlier pass behind
    functions = []
    try:
        for path in args.reports:
            with open(path) as f:
                source = os.path.relpath(path, args.out_dir).removesuffix(".ptxas")
                functions += parse(f, source)
    except ReportError as e:
        print(f"cuda-check: {e}", file=sys.stderr)
        return 1
    if not any(f.entry for f in functions):
        print(
            f"cuda-check: ptxas reported no kernel in {' '.join(args.reports)}: were they "
            "compiled with -Xptxas -v?",
            file=sys.stderr,
        )
        return 1
    name_functions(functions)
    print(write_reports(functions, args.out_dir, args.nvcc and nvcc_version(args.nvcc)))
    errors = spill_errors(functions)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(
            f"cuda-check: {len(errors)} function(s) spill registers to local memory (see "
            f"{args.out_dir}/resources.md)",
            file=sys.stderr,
        )
        return 1
    line = summary(functions, args.out_dir)
    print(line)  # make prints it again from FILE, when the whole check has passed
    if args.checked:
        with open(args.checked, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
