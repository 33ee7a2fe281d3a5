#!/usr/bin/env bash
# The device copies the working tree with each call, and the tree plus the largest staging part (.gpu/c1, 57 MiB) must
# fit in 64 MiB: move the recorded GPU results out of the tree while staging and running, and back after.
#   bash benchmarks/gpu/aside.sh out    # before the staging calls
#   bash benchmarks/gpu/aside.sh back   # after the last device call; commit nothing in between (they show as deleted)
set -euo pipefail
ASIDE=${TRTFORGE_ASIDE:-/tmp/trtforge-results-aside}
case "${1:-}" in
  out)
    mkdir -p "$ASIDE"
    for d in benchmarks/results/h[0-9]*_20*; do [ -d "$d" ] && mv "$d" "$ASIDE/"; done
    echo "results moved to $ASIDE; tracked tree now $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes";;
  back)
    [ -d "$ASIDE" ] && for d in "$ASIDE"/*; do [ -e "$d" ] && mv "$d" benchmarks/results/; done
    git status --short benchmarks/results | grep '^ D' && { echo "still missing (above)" >&2; exit 1; } || echo "results back";;
  *) echo "usage: $0 out|back" >&2; exit 2;;
esac
