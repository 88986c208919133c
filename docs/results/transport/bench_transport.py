"""Transport cost, old (named slabs) vs new (memfd + SCM_RIGHTS): pack+send / receive+unpack
of a 4.8 MB uint8 batch, recycling on, one process; median of interleaved rounds.

The old transport is read from a checkout of the commit before nameless slabs (7451e5d) at
/tmp/baseline (``git worktree add /tmp/baseline 7451e5d``); the new one from this clone's
``src``. Run from the clone's root with ``.venv/bin/python docs/results/transport/bench_transport.py``;
results.json beside this file is its output."""
import gc, importlib.util, json, os, statistics, sys, time
from multiprocessing.connection import Pipe
import torch
from drapps.runtime.recycling import SlabRecycler
from drapps.runtime.slabs import SlabWriter

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod); return mod

old = load("/tmp/baseline/src/drapps/runtime/transport.py", "old_transport")
new = load("src/drapps/runtime/transport.py", "new_transport")
batch = torch.randint(0, 255, (32, 3, 224, 224), dtype=torch.uint8)  # 4.8 MB

def run_old(n):
    prefix = old.slab_prefix(f"{os.getpid()}_bench", 0)
    writer, recycler = old.SlabWriter(), old.SlabRecycler()
    r, s = Pipe(duplex=False)
    pack_t, unpack_t = [], []
    for _ in range(n):
        t0 = time.perf_counter(); p = old.pack(batch, old.slab_name(prefix), writer); s.send(p)
        t1 = time.perf_counter(); got = old.unpack(r.recv(), recycler=recycler); x = got.sum() if False else None
        t2 = time.perf_counter(); del got; gc.collect()
        pack_t.append(t1 - t0); unpack_t.append(t2 - t1)
    recycler.close(); old.remove_slabs(prefix)
    return statistics.median(pack_t), statistics.median(unpack_t)

def run_new(n):
    writer, recycler = SlabWriter(), SlabRecycler()
    r, s = Pipe(duplex=True)
    pack_t, unpack_t = [], []
    for _ in range(n):
        t0 = time.perf_counter(); new.send_message(s, ("ok", new.pack(batch, writer)), writer)
        t1 = time.perf_counter(); p = new.receive_message(r)[1]
        got = new.unpack(p, release=recycler.releaser(0, p.slab))
        t2 = time.perf_counter(); del got; gc.collect()
        for notices in recycler.drain().values(): writer.released(notices)
        pack_t.append(t1 - t0); unpack_t.append(t2 - t1)
    writer.close()
    return statistics.median(pack_t), statistics.median(unpack_t)

rounds = {"old": [], "new": []}
for _ in range(5):
    for name, fn in (("old", run_old), ("new", run_new)):
        rounds[name].append(fn(60))
out = {k: {"pack_send_ms": round(1e3 * statistics.median(p for p, _ in v), 3),
           "receive_unpack_ms": round(1e3 * statistics.median(u for _, u in v), 3),
           "pack_rounds_ms": [round(1e3 * p, 3) for p, _ in v],
           "unpack_rounds_ms": [round(1e3 * u, 3) for _, u in v]} for k, v in rounds.items()}
print(json.dumps(out, indent=1))
