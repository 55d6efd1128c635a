"""A writer process for the commit-protocol tests (run as a script, not collected).

``python racer.py K A_PATH`` opens ``A_PATH`` once, starts an in-process
engine, then reads one JSON command per line on stdin::

    {"out": path, "name": "", "overwrite": bool, "delay": seconds, "hold": point}

and runs ``(a * (K + 2)).to_zarr(out, name=name, overwrite=overwrite)`` after
``delay`` seconds. When ``hold`` names a point of the commit protocol --
``"lock"`` (just after the output's lock is taken), ``"create"`` (just after
the array is created) or ``"commit"`` (every unit written, just before it is
marked complete) -- the job prints ``{"event": "held"}`` there and waits for a
line ``go`` (a slow job, without depending on how fast this machine is).
Each job ends with one line ``{"event": "ok"}`` or ``{"event": "error",
"type": ..., "message": ...}``.
"""

import json
import sys
import time


def main():
    k, a_path = int(sys.argv[1]), sys.argv[2]
    import tilearray as ta
    from tilearray.engine import output
    from tilearray.storage import array as sarray

    hold = {"point": None}

    def say(**event):
        print(json.dumps(event), flush=True)

    def pause(point):
        if hold["point"] == point:
            say(event="held", point=point)
            line = sys.stdin.readline()
            assert line.strip() == "go", line

    orig_lock, orig_create, orig_mark = sarray.acquire_lock, output.create, output.mark_complete

    def acquire_lock(ref):
        orig_lock(ref)
        pause("lock")

    def create(*args, **kwargs):
        out = orig_create(*args, **kwargs)
        pause("create")
        return out

    def mark_complete(*args, **kwargs):
        pause("commit")
        return orig_mark(*args, **kwargs)

    sarray.acquire_lock, output.create, output.mark_complete = acquire_lock, create, mark_complete
    with ta.Engine(n_workers=1, threads_per_worker=1, processes=False,
                   memory_per_worker="1GiB", quiet=True):
        a = ta.open(a_path)
        say(event="ready")
        for line in sys.stdin:
            cmd = json.loads(line)
            hold["point"] = cmd.get("hold")
            time.sleep(cmd.get("delay", 0.0))
            try:
                (a * (k + 2)).to_zarr(cmd["out"], name=cmd.get("name", ""),
                                      overwrite=cmd.get("overwrite", False))
                say(event="ok")
            except Exception as e:  # reported to the test, which judges it
                say(event="error", type=type(e).__name__, message=str(e))


if __name__ == "__main__":
    main()
