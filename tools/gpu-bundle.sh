#!/usr/bin/env bash
# Builds the `gpu` feature's test and bench executables here and copies them into .gpu-bin/
# (ignored by git) with a runner, for a GPU machine that has the driver and NVRTC but no Rust.
# The binaries open libcuda and libnvrtc at run time, so nothing CUDA is needed to build them
# (except with `--features candle-cuda`: see tools/cuda-from-pypi.sh). They are copied without
# their debug info (symbols kept, for backtraces): a tenth of the size to carry.
#
#   tools/gpu-bundle.sh                    # every test binary (cargo test --release --features gpu)
#   tools/gpu-bundle.sh test --test gpu    # cargo arguments pass through
#   tools/gpu-bundle.sh bench --bench gpu  # bench binaries
#
# On the GPU machine, from the repository root: `bash .gpu-bin/run-all.sh [test arguments]`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
shift || true
case $mode in
    test) cmd=(cargo test --release --features gpu --no-run --message-format=json "$@") ;;
    bench) cmd=(cargo bench --features gpu --no-run --message-format=json "$@") ;;
    *) echo "usage: tools/gpu-bundle.sh [test|bench] [cargo arguments]" >&2; exit 2 ;;
esac
rm -rf .gpu-bin
mkdir -p .gpu-bin
"${cmd[@]}" | python3 -c '
import json, os, shutil, subprocess, sys
names = []
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    exe = message.get("executable")
    if message.get("reason") == "compiler-artifact" and exe and message.get("profile", {}).get("test"):
        name = os.path.basename(exe).rsplit("-", 1)[0]
        target = os.path.join(".gpu-bin", name)
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-debug", "-o", target, exe], check=True)
        else:
            shutil.copy2(exe, target)
        names.append(name)
with open(".gpu-bin/run-all.sh", "w") as f:
    f.write("#!/usr/bin/env bash\n# Runs every bundled binary; the exit status is the first failure.\n")
    f.write("cd \"$(dirname \"$0\")/..\"\nrc=0\n")
    for name in names:
        f.write("echo \"== %s\"; .gpu-bin/%s \"$@\" || { s=$?; [ $rc = 0 ] && rc=$s; }\n" % (name, name))
    f.write("exit $rc\n")
print("bundled:", " ".join(names) or "nothing")
'
chmod +x .gpu-bin/run-all.sh
du -sh .gpu-bin
