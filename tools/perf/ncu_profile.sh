#!/usr/bin/env bash
# The Nsight Compute step of the profile scripts: profiles the second launch of the kernels matching KERNEL (a regex)
# that COMMAND makes, with a cold cache and warp-state samples per SASS instruction, into DIR/NAME.ncu-rep, and
# writes ncu's log (ncu.txt), the SASS export (sass.csv), the details page (details.txt) and a stall summary by code
# region (tools/perf/ncu_stalls.py; stalls.txt, also printed) into DIR.
#   tools/perf/ncu_profile.sh DIR NAME KERNEL COMMAND...
set -euo pipefail
[ "$#" -ge 4 ] || { echo "usage: $0 DIR NAME KERNEL COMMAND..." >&2; exit 2; }
dir=$1 name=$2 kernel=$3
shift 3
mkdir -p "$dir"
ncu --clock-control none --cache-control all --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
  --set full --import-source no -f -o "$dir/$name" "$@" > "$dir/ncu.txt" 2>&1
ncu --import "$dir/$name.ncu-rep" --page source --csv --print-source sass > "$dir/sass.csv"
ncu --import "$dir/$name.ncu-rep" --page details > "$dir/details.txt"
python3 "$(dirname "$0")/ncu_stalls.py" "$dir/sass.csv" | tee "$dir/stalls.txt"
