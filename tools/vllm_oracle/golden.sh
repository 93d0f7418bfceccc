#!/usr/bin/env bash
# Regenerates tests/golden/NAME.vllm.json from tests/golden/NAME.json with the
# oracle (run setup.sh first). With --check, only reports which outputs differ.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
golden="$(cd "$here/../../tests/golden" && pwd)"
status=0
for trace in "$golden"/*.json; do
  case "$trace" in *.vllm.json) continue ;; esac
  out="${trace%.json}.vllm.json"
  if [ "${1:-}" = "--check" ]; then
    if ! "$here/.venv/bin/python" "$here/oracle.py" "$trace" 2>/dev/null | cmp -s - "$out"; then
      echo "differs: $out"; status=1
    fi
  else
    "$here/.venv/bin/python" "$here/oracle.py" "$trace" --json "$out" 2>/dev/null
    echo "wrote $out"
  fi
done
exit $status
