"""Where a sampled process spent its time: a `py-spy record --format raw` file (collapsed stacks: "frame;frame;... N")
condensed to the shares of its innermost rlfarm frames and of its leaf frames (what the host itself was running:
a numpy copy, a CUDA call, a lock). usage: python3 launch/device/pyspy_top.py RAW [top]"""
import sys
from collections import Counter


def condense(path: str, top: int = 12) -> dict:
    ours, leaves, total = Counter(), Counter(), 0
    for line in open(path, errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, samples = stack.split(";"), int(count)
        total += samples
        leaves[frames[-1]] += samples
        inner = next((f for f in reversed(frames) if "rlfarm/" in f), frames[-1])
        ours[inner] += samples
    share = lambda counter: [(frame[:160], round(n / total, 3)) for frame, n in counter.most_common(top)]  # noqa: E731
    return {"samples": total, "innermost_rlfarm": share(ours), "leaf": share(leaves)}


if __name__ == "__main__":
    import json

    print(json.dumps(condense(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12), indent=1))
