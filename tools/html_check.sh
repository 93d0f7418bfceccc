#!/usr/bin/env bash
# Renders the HTML report of a run and of a sweep in headless Chromium
# (Debian's `chromium` package) and checks what the browser drew: the page
# parses, its tables and figures are there. Screenshots go to OUT
# (default target/html_check). Fails loudly.
#
#   tools/html_check.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/html_check}
PDSIM=${PDSIM:-target/release/pdsim}
mkdir -p "$OUT"
if ! command -v chromium >/dev/null 2>&1; then
    echo "html_check: chromium not found (apt-get install chromium)" >&2
    exit 1
fi
[ -x "$PDSIM" ] || cargo build --release
CHROME=(chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run
        --disable-background-networking --disable-component-update --disable-sync
        --user-data-dir="$(mktemp -d)")

"$PDSIM" run scenarios/llmd_nixl_pull.ron --horizon 300 --warmup 30 --slo ttft=0.05 \
    --html "$OUT/run.html" > /dev/null
rm -rf "$OUT/sweep"
"$PDSIM" sweep tests/scenarios/tiny.ron --seeds 1..3 --grid workload.session_rate=0.5,1,2 \
    --horizon 60 --warmup 5 --jobs 2 --out "$OUT/sweep" --html > /dev/null 2>&1

check() { # page, tables, figures
    local page=$1 tables=$2 figures=$3 dom url
    url="file://$(realpath "$page")"
    dom=$("${CHROME[@]}" --dump-dom "$url" 2>/dev/null)
    local t f
    t=$(grep -o '<table' <<<"$dom" | wc -l)
    f=$(grep -o '<svg' <<<"$dom" | wc -l)
    if [ "$t" -lt "$tables" ] || [ "$f" -lt "$figures" ]; then
        echo "html_check: $page: $t tables, $f figures (expected at least $tables and $figures)" >&2
        exit 1
    fi
    grep -q '</html>' <<<"$dom" || { echo "html_check: $page: not a whole page" >&2; exit 1; }
    "${CHROME[@]}" --window-size=1200,2400 --screenshot="$(realpath "${page%.html}.png")" "$url" > /dev/null 2>&1
    [ -s "${page%.html}.png" ] || { echo "html_check: $page: no screenshot" >&2; exit 1; }
    echo "html_check: $page: $t tables, $f figures; screenshot ${page%.html}.png"
}
check "$OUT/run.html" 4 5
check "$OUT/sweep/summary.html" 1 10
