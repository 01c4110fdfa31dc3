#!/usr/bin/env bash
# The figures of docs/benchmarks.md "Perfetto export": `gradscope export` to Perfetto and to Chrome JSON
# on the same traces, PAIRS pairs run interleaved (Perfetto, then Chrome), each run's wall time and peak
# RSS from /usr/bin/time and its file's size. One line per run; take medians per input and format.
#
#   bench/export_figures.sh GRADSCOPE PAIRS TRACE...
#
# Outputs go to ${TMPDIR:-/tmp} and are removed after each run (the JSON of 10 M calls is 2 GiB).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 GRADSCOPE PAIRS TRACE..." >&2; exit 2; }
gradscope=$1
pairs=$2
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/gradscope-export-figures.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "trace format pair wall_s peak_rss_kib bytes load_average"
for trace in "$@"; do
  for pair in $(seq 1 "$pairs"); do
    for format in perfetto chrome-trace; do
      out="$work/out.$format"
      /usr/bin/time -f "%e %M" -o "$work/time" "$gradscope" export "$trace" --format "$format" -o "$out" 2>/dev/null
      echo "$(basename "$trace") $format $pair $(cat "$work/time") $(stat -c%s "$out") $(cut -d' ' -f1 /proc/loadavg)"
      rm -f "$out"
    done
  done
done
