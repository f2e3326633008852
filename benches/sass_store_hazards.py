#!/usr/bin/env python3
"""Finds, in the attention kernel's SASS (benches/ptxas_report.py --sass), each global store
whose registers a later instruction of the same straight-line code overwrites: a store reads
its registers only when the memory pipe takes it, so that write waits for it (Nsight Compute
shows the wait as a long-scoreboard stall on the writing instruction).

    python3 benches/sass_store_hazards.py /tmp/k.sass [window, default 60 instructions]

Prints one line per such store and the count; a branch or exit ends a store's window.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptxas_report import forward_function  # noqa: E402

INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")


def registers(operands):
    """Vector registers an operand list names (R2.64 is R2 and R3)."""
    found = set()
    for m in re.finditer(r"\bR(\d+)(\.64)?", operands):
        found.add(int(m.group(1)))
        if m.group(2):
            found.add(int(m.group(1)) + 1)
    return found


def main():
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    code = []
    for line in forward_function(open(sys.argv[1]).read()).splitlines():
        m = INSTRUCTION.match(line)
        if m:
            code.append((int(m.group(1), 16), m.group(3), m.group(4)))
    hazards = 0
    for i, (address, opcode, operands) in enumerate(code):
        if not opcode.startswith("STG"):
            continue
        read = registers(operands)
        for later, opcode2, operands2 in code[i + 1:i + 1 + window]:
            if opcode2.startswith(("BRA", "EXIT", "RET")):
                break
            written = re.match(r"R(\d+)\b", operands2.split(",")[0].strip())
            if not opcode2.startswith("STG") and written and int(written.group(1)) in read:
                print(f"{address:#x} {opcode} {operands}: register {written.group(0)} overwritten at {later:#x} {opcode2} {operands2}")
                hazards += 1
                break
    print(f"{hazards} stores whose registers are overwritten in their window")


main()
