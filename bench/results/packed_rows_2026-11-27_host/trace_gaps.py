"""Where the GPU waits in a Chrome trace of bench/train.py (--profile N --trace DIR): idle time between kernels,
per 20 ms window of the trace, and the host operator that launched the kernel after each gap over 20 us.

python3 bench/results/packed_rows_2026-11-27_host/trace_gaps.py TRACE.json[.gz] ...
"""

import bisect
import collections
import gzip
import json
import sys


def report(path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                  "gpu_memset")),
                     key=lambda e: e["ts"])
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    host = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    starts = [e["ts"] for e in host]

    def launched_in(ts: float) -> str:
        enclosing = [c for c in host[max(0, bisect.bisect_right(starts, ts) - 20000):bisect.bisect_right(starts, ts)]
                     if c["ts"] <= ts <= c["ts"] + c["dur"]]
        return " < ".join(c["name"][:40] for c in sorted(enclosing, key=lambda c: c["dur"])[:3]) or "(none)"

    first = kernels[0]["ts"]
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - first
    busy = sum(e["dur"] for e in kernels)
    windows, by_launcher, counts, end = collections.Counter(), collections.Counter(), collections.Counter(), None
    for kernel in kernels:
        if end is not None and kernel["ts"] > end:
            gap = kernel["ts"] - end
            windows[int((end - first) / 1e3 // 20) * 20] += gap
            if gap > 20:
                launch = launches.get(kernel["args"].get("correlation"))
                key = launched_in(launch["ts"]) if launch else "(no launch record)"
                by_launcher[key] += gap
                counts[key] += 1
        end = max(end or 0, kernel["ts"] + kernel["dur"])
    print(f"{path}: GPU span {span / 1e3:.1f} ms, kernels {busy / 1e3:.1f} ms, idle {(span - busy) / 1e3:.1f} ms, "
          f"of it in gaps over 20 us {sum(by_launcher.values()) / 1e3:.1f} ms")
    print("  idle per 20 ms window (ms), windows over 1.5 ms:",
          {start: round(idle / 1e3, 1) for start, idle in sorted(windows.items()) if idle > 1500})
    for key, gap in by_launcher.most_common(12):
        print(f"  {gap / 1e3:7.2f} ms in {counts[key]:4d} gaps before kernels launched in {key}")


if __name__ == "__main__":
    for trace in sys.argv[1:]:
        report(trace)
