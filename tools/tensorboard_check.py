#!/usr/bin/env python3
"""TensorBoard's side of oxalign's event files (needs `pip install tensorboard torch`).

  tensorboard_check.py fixture OUT_DIR   writes a small event file with PyTorch's
                                         SummaryWriter (the fixture the Rust reader's test
                                         decodes: loss 0.5 @ step 1, 0.25 @ step 2, lr 1e-3 @ 1)
  tensorboard_check.py check RUN_DIR     loads RUN_DIR/tensorboard with TensorBoard's own
                                         EventAccumulator and compares every scalar with
                                         RUN_DIR/metrics.jsonl (float32 rounding); exit 1 on
                                         any difference
"""
import json
import math
import pathlib
import sys


def fixture(out_dir):
    from torch.utils.tensorboard import SummaryWriter

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = SummaryWriter(log_dir=str(out), filename_suffix=".fixture")
    w.add_scalar("loss", 0.5, 1)
    w.add_scalar("lr", 1e-3, 1)
    w.add_scalar("loss", 0.25, 2)
    w.close()
    files = sorted(out.glob("events.out.tfevents.*"))
    target = out / "torch_summary_writer.tfevents"
    files[-1].rename(target)
    print(target)


def check(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = pathlib.Path(run_dir)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tb = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            tb[(tag, e.step)] = e.value
    want = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        for k, v in m.items():
            if k not in ("step", "unix_ms"):
                want[(k, m["step"])] = float("nan") if v is None else v
    bad = []
    for key in sorted(set(tb) | set(want)):
        a, b = tb.get(key), want.get(key)
        same = a is not None and b is not None and (
            (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6 * max(1.0, abs(b))
        )
        if not same:
            bad.append((key, a, b))
    steps = sorted({s for _, s in want})
    print(f"{len(tb)} scalars over {len(steps)} steps read by TensorBoard; {len(bad)} differ from metrics.jsonl")
    for key, a, b in bad[:10]:
        print(f"  {key}: tensorboard {a}, metrics.jsonl {b}")
    return 1 if bad or not tb else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("fixture", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(fixture(sys.argv[2]) if sys.argv[1] == "fixture" else check(sys.argv[2]))
