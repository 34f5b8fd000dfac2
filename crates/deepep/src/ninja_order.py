"""commstack's ninja front for torch's cpp_extension build (the DeepEP step).

torch writes build.ninja and runs `ninja -v [-j N]` in its directory. With relocatable
device code every object, the host ones (rule `compile`) too, feeds the device link
(`cuda_devlink`), so to ninja >= 1.12, which starts the ready job on the longest path
first with each edge weighing 1, all compiles weigh the same, and it starts them in the
order torch wrote them: the `.cu` objects first, the host objects last. DeepEP's longest
job, the host compile of csrc/python_api.cpp (torch's and pybind11's headers, -O3 -g),
so starts last and runs alone at the end wherever there are fewer cores than jobs.

This front writes build.commstack.ninja beside torch's file. It includes build.ninja as it
is and adds, after each host object, a chain of stamp edges as long as the longest path
of torch's graph, so that the host compiles weigh the most and ninja starts them first.
The commands and the objects are torch's; the stamps are empty files under
.commstack-order/. Anything else (`--version`, `-t ...`, `-f`, `-C`, no build.ninja here)
goes to ninja unchanged.

Usage: python -I -S ninja_order.py REAL_NINJA [NINJA ARGS...]
"""

import os
import sys

FILE = "build.ninja"
OURS = "build.commstack.ninja"
STAMPS = ".commstack-order"


class Unsure(Exception):
    """build.ninja holds what this reader does not follow: ninja runs as torch wrote it."""


def tokens(line):
    """The words of a ninja line, `$ `, `$:` and `$$` unescaped; ':' ends a word alone.
    A variable (`$x`, `${x}`) in a build line is not expanded here: Unsure."""
    out, word, i = [], "", 0
    while i < len(line):
        c = line[i]
        if c == "$":
            if i + 1 >= len(line) or line[i + 1] not in " :$":
                raise Unsure("a variable in a build line: %r" % line[:120])
            word += line[i + 1]
            i += 2
            continue
        if c == " ":
            if word:
                out.append(word)
            word = ""
        elif c == ":":
            if word:
                out.append(word)
            out.append(":")
            word = ""
        else:
            word += c
        i += 1
    if word:
        out.append(word)
    return out


def edges(text):
    """(outputs, rule, inputs) of every `build` statement; a continued line (`$` at the
    end) is not read here: Unsure."""
    found = []
    for line in text.splitlines():
        if not line.startswith("build "):
            continue
        if line.endswith("$") and not line.endswith("$$"):
            raise Unsure("a continued build line: %r" % line[:120])
        words = tokens(line[len("build "):])
        if ":" not in words:
            continue
        colon = words.index(":")
        outs = [w for w in words[:colon] if w != "|"]
        rest = words[colon + 1:]
        if not rest:
            continue
        ins = [w for w in rest[1:] if w not in ("|", "||", "|@")]
        found.append((outs, rest[0], ins))
    return found


def escape(path):
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def plan(text):
    """build.commstack.ninja's text, or None when there is nothing to reorder."""
    graph = edges(text)
    consumers = {}
    for n, (_, _, ins) in enumerate(graph):
        for i in ins:
            consumers.setdefault(i, []).append(n)
    depth = {}

    def path_from(n):
        # Longest path (in edges) from edge n to the end of the graph, itself included.
        if n not in depth:
            depth[n] = 0
            below = [path_from(c) for o in graph[n][0] for c in consumers.get(o, [])]
            depth[n] = 1 + max(below, default=0)
        return depth[n]

    longest = max((path_from(n) for n in range(len(graph))), default=0)
    hosts = [outs[0] for outs, rule, _ in graph if rule == "compile" and outs]
    if not hosts:
        return None
    lines = [
        "# commstack: torch's build.ninja, unchanged, and a chain of %d stamp(s) after each" % longest,
        "# host object, so that ninja's longest-path-first order starts the host compiles first.",
        "include %s" % FILE,
        "",
        "rule commstack_order",
        "  command = touch $out",
        "  description = commstack order stamp $out",
        "",
    ]
    last = []
    for h, obj in enumerate(hosts):
        before = escape(obj)
        for k in range(longest):
            stamp = "%s/%d.%d" % (STAMPS, h, k)
            lines.append("build %s: commstack_order %s" % (stamp, before))
            before = stamp
        last.append(before)
    # With a `default` statement ninja builds only what it names: the stamps too, or they
    # would not be in the plan and weigh nothing. Without one it builds every root.
    if any(line.startswith("default ") for line in text.splitlines()):
        lines.append("default %s" % " ".join(last))
    return "\n".join(lines) + "\n"


def main():
    real, args = sys.argv[1], sys.argv[2:]
    ours = []
    untouched = any(a in ("--version", "-t", "-f", "-C") or a[:2] in ("-t", "-f", "-C") for a in args)
    if not untouched and os.path.isfile(FILE):
        # Only an order: whatever goes wrong here, ninja runs torch's file as it is, and
        # the build log says why.
        try:
            with open(FILE, encoding="utf-8") as f:
                text = plan(f.read())
            if text is not None:
                os.makedirs(STAMPS, exist_ok=True)
                with open(OURS + ".tmp", "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(OURS + ".tmp", OURS)
                ours = ["-f", OURS]
        except (Unsure, OSError, ValueError, RecursionError) as e:
            print("commstack ninja front: %s; ninja runs in torch's order" % e, file=sys.stderr)
    os.execv(real, [real] + ours + args)


if __name__ == "__main__":
    main()
