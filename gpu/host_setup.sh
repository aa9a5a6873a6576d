#!/bin/bash
# Install tunelab's offline bundles on an air-gapped GPU host, from the repository root:
#
#   bash gpu/host_setup.sh [PARTS_ROOT] [DEST]        (defaults: .gpu  /tmp/tunelab-rt)
#
# PARTS_ROOT holds one folder per bundle (made by `python -m tunelab.offline bundle-runtime|
# bundle-orchestrator` or `tunelab runtime bundle`), each with manifest.json and some or all of the
# parts <name>.tar.xz.partNN. Parts may arrive over several calls: each call stashes what it finds
# under $DEST/.parts/<name>/, and installs every bundle whose parts are now all there (sha256 of
# every part and of the joined archive checked against manifest.json). Safe to run again: bundles
# already installed are skipped.
# Once a vLLM runtime is installed it builds the tokenizer and the random-weight model(s) of MODEL_SHAPE
# (unless MODEL=0), then prints versions. MODEL_SHAPE (default llama-1b; several: "llama-1b llama-3.1-8b"):
#   llama-1b      the ~1.1B Llama (2.2 GB)        -> $DEST/model              (tokenizer $DEST/tok, 32,000 tokens)
#   llama-3.1-8b  the Llama-3.1-8B shape (16 GB)  -> $DEST/model-llama-3.1-8b (tokenizer $DEST/tok-128256)
# gpu/run_sweep.sh links them as <tunelab home>/models/llama-1b and llama-8b. Needs: python3 (the host's, the one
# vLLM will run under), xz or Python's lzma, tar, and for the model a CUDA GPU with torch/transformers.
# Output: $DEST/<name>/runtime.json per bundle; copies of logs and records under $OUT if set.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PARTS_ROOT=${1:-$REPO/.gpu}
DEST=${2:-/tmp/tunelab-rt}
PY=${PYTHON:-python3}
OUT=${OUT:-}
T0=$(date +%s)
mkdir -p "$DEST/.parts"
[ -n "$OUT" ] && mkdir -p "$OUT" && exec > >(tee -a "$OUT/host_setup.log") 2>&1

echo "== host: $(hostname) $(date -u +%FT%TZ); python: $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader

# 1. stash this call's parts and manifests (they may not survive to the next call in the checkout)
for m in "$PARTS_ROOT"/*/manifest.json; do
  [ -f "$m" ] || continue
  d=$(dirname "$m"); n=$(basename "$d"); mkdir -p "$DEST/.parts/$n"
  cp -f "$m" "$DEST/.parts/$n/manifest.json"
  for p in "$d"/*.part[0-9]*; do [ -f "$p" ] && cp -n "$p" "$DEST/.parts/$n/"; done
done

# 2. verify + join + unpack every complete bundle (standard library only: runs before any bundle exists)
$PY - "$DEST" <<'EOF'
import hashlib, json, os, shutil, subprocess, sys, tarfile, time
dest = sys.argv[1]
for name in sorted(os.listdir(os.path.join(dest, ".parts"))):
    src = os.path.join(dest, ".parts", name)
    mf = os.path.join(src, "manifest.json")
    if not os.path.isfile(mf):
        continue
    m = json.load(open(mf))
    root = os.path.join(dest, m["name"]); site = os.path.join(root, m.get("top_dir", "site"))
    stamp = os.path.join(root, ".archive_sha256")
    if os.path.isfile(stamp) and open(stamp).read().strip() == m["archive_sha256"] and os.path.isdir(site):
        print(f"[{name}] unpacked already"); continue
    have = [p for p in m["parts"] if os.path.isfile(os.path.join(src, p["name"]))]
    mib = sum(p["size_bytes"] for p in have) / 2**20
    if len(have) < len(m["parts"]):
        missing = [p["name"] for p in m["parts"] if p not in have]
        print(f"[{name}] {len(have)}/{len(m['parts'])} parts here ({mib:.1f} MiB); waiting for {', '.join(missing)}")
        continue
    bad = False
    for p in m["parts"]:
        f = os.path.join(src, p["name"]); h = hashlib.sha256()
        with open(f, "rb") as fh:
            for c in iter(lambda: fh.read(1 << 20), b""): h.update(c)
        if os.path.getsize(f) != p["size_bytes"] or h.hexdigest() != p["sha256"]:
            print(f"[{name}] PART CORRUPT: {p['name']} (size {os.path.getsize(f)} / sha256 {h.hexdigest()}); "
                  "removed from the stash, send it again"); os.unlink(f); bad = True
    if bad:
        continue
    os.makedirs(root, exist_ok=True)
    if os.path.isdir(site): shutil.rmtree(site)
    arc = os.path.join(root, m["archive_name"]); h = hashlib.sha256(); t = time.time()
    with open(arc, "wb") as out:
        for p in m["parts"]:
            with open(os.path.join(src, p["name"]), "rb") as fh:
                for c in iter(lambda: fh.read(1 << 20), b""): out.write(c); h.update(c)
    if h.hexdigest() != m["archive_sha256"]:
        print(f"[{name}] JOINED ARCHIVE sha256 mismatch: parts from different builds"); os.unlink(arc); continue
    if shutil.which("xz") and shutil.which("tar"):
        rc = subprocess.run(f"xz -dc -T0 '{arc}' | tar -x -C '{root}'", shell=True).returncode
    else:
        with tarfile.open(arc, "r:xz") as tf: tf.extractall(root, filter="data"); rc = 0
    os.unlink(arc)
    if rc != 0 or not os.path.isdir(site):
        print(f"[{name}] UNPACK FAILED rc={rc}"); continue
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", site], capture_output=True)  # no .pyc travel
    open(stamp, "w").write(m["archive_sha256"] + "\n")
    print(f"[{name}] unpacked {m['archive_bytes']/2**20:.1f} MiB -> {site} and byte-compiled in {time.time()-t:.1f} s")
EOF

# 3. import check + runtime record with tunelab.offline (needs pydantic: from the orchestrator
#    bundle if it is there, else from a vLLM bundle, which carries pydantic too)
HELPER=""
for s in "$DEST"/orchestrator-*/site "$DEST"/vllm-*/site; do
  [ -d "$s/pydantic" ] && { HELPER=$s; break; }
done
for d in "$DEST"/.parts/*/; do
  n=$(basename "$d"); root="$DEST/$n"
  [ -f "$root/.archive_sha256" ] || continue
  if [ -f "$root/runtime.json" ] && [ "$root/runtime.json" -nt "$root/.archive_sha256" ]; then
    echo "[$n] installed already: $root/runtime.json"; continue
  fi
  [ -n "$HELPER" ] || { echo "[$n] no unpacked site with pydantic to run tunelab.offline"; continue; }
  echo "[$n] import check (vLLM: ~30 s) ..."
  if ! PYTHONPATH="$HELPER:$REPO" $PY -m tunelab.offline install "$d/manifest.json" "$DEST" --parts-dir "$d" \
       --python "$(command -v $PY)" > "$root/install.log" 2>&1; then
    echo "[$n] INSTALL CHECK FAILED:"; tail -25 "$root/install.log"; continue
  fi
  echo "[$n] ok: $root/runtime.json"
done

# 4. the model(s) of MODEL_SHAPE (once a vLLM runtime is in place); a model is built once: its last file marks it done
if [ "${MODEL:-1}" = 1 ] && ls "$DEST"/vllm-*/runtime.json >/dev/null 2>&1; then
  for shape in ${MODEL_SHAPE:-llama-1b}; do
    case "$shape" in
      llama-1b)     mdir=$DEST/model; tok=$DEST/tok; vocab=32000; done_file=model.safetensors ;;
      llama-3.1-8b) mdir=$DEST/model-llama-3.1-8b; tok=$DEST/tok-128256; vocab=128256
                    done_file=model.safetensors.index.json ;;
      *) echo "MODEL_SHAPE: unknown shape '$shape' (llama-1b, llama-3.1-8b)"; continue ;;
    esac
    [ -f "$mdir/$done_file" ] && { echo "== model $shape built already: $mdir"; continue; }
    echo "== building tokenizer ($vocab tokens) + model $shape -> $mdir ($(df -h --output=avail "$DEST" | tail -1 | tr -d ' ') free)"
    [ -f "$tok/tokenizer.json" ] || $PY "$REPO/gpu/make_tokenizer.py" "$tok" --vocab "$vocab" || echo "TOKENIZER FAILED"
    $PY "$REPO/gpu/make_model.py" --shape "$shape" "$mdir" "$tok" || echo "MODEL FAILED ($shape)"
  done
fi

# 5. versions
echo "== installed runtimes"
for r in "$DEST"/*/runtime.json; do
  [ -f "$r" ] || continue
  $PY - "$r" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [f"{c['name']}{c['specifier']} (have {c['installed']})" for c in r["host_checks"]
       if not c["ok"] and not c.get("served_on_measured_image")]
known = [f"{c['name']} {c['installed']}" for c in r["host_checks"] if c.get("served_on_measured_image")]
print(f"{r['name']}: {json.dumps(r['versions'])} import_s={r['import_check_s']}")
print(f"   PYTHONPATH={':'.join(r['pythonpath'])} env={json.dumps(r['env'])}")
print(f"   host requirements not met: {bad if bad else 'none'}")
if known:
    print(f"   outside vLLM's pins but seen serving on the measured H200 image: {', '.join(known)}")
EOF
done
for m in "$DEST/model" "$DEST/model-llama-3.1-8b"; do
  [ -f "$m/config.json" ] && echo "model: $m ($(du -sh "$m" | cut -f1))"
done
if [ -n "$OUT" ]; then
  $PY -m pip list --format=freeze > "$OUT/host_pip_freeze.txt" 2>/dev/null
  for r in "$DEST"/*/runtime.json; do [ -f "$r" ] && cp "$r" "$OUT/$(basename "$(dirname "$r")").runtime.json"; done
  for l in "$DEST"/*/install.log; do [ -f "$l" ] && cp "$l" "$OUT/$(basename "$(dirname "$l")").install.log"; done
fi
echo "== host_setup_s=$(( $(date +%s) - T0 ))"
