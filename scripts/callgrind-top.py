#!/usr/bin/env python3
"""Self cost by function of one callgrind dump, or the callers of one function.

valgrind 3.19's callgrind_annotate shows only the threads' roots (100 % in `clone`) for the
dumps `bench --callgrind` takes with `vgdb dump`; this reads the file itself.

  scripts/callgrind-top.py DIR/bulk-upload-server.PID.out            # top 25 by self cost
  scripts/callgrind-top.py DIR/bulk-upload-server.PID.out -n 40
  scripts/callgrind-top.py DIR/bulk-upload-server.PID.out -c memcpy  # who calls memcpy
"""

import argparse
import collections


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump")
    parser.add_argument("-n", type=int, default=25, help="lines to print")
    parser.add_argument("-c", "--callers-of", help="substring of a callee's name")
    args = parser.parse_args()

    self_cost = collections.Counter()
    callers = collections.Counter()
    function = callee = None
    call_line_next = False
    with open(args.dump) as dump:
        for line in dump:
            if line.startswith("fn="):
                function = line[3:].strip()
            elif line.startswith("cfn="):
                callee = line[4:].strip()
            elif line.startswith("calls="):
                call_line_next = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                fields = line.split()
                if len(fields) < 2:
                    continue
                cost = int(fields[1])
                if call_line_next:
                    # The cost line after `calls=` is the call's inclusive cost.
                    call_line_next = False
                    if args.callers_of and args.callers_of in (callee or ""):
                        callers[function] += cost
                else:
                    self_cost[function] += cost

    total = sum(self_cost.values())
    print(f"{total:,} instructions")
    rows = callers if args.callers_of else self_cost
    for name, cost in rows.most_common(args.n):
        print(f"{100 * cost / total:6.1f} %  {name}")


if __name__ == "__main__":
    main()
