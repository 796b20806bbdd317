#!/usr/bin/env bash
# The real Python Xet client (huggingface_hub + hf_xet from tests/xet-requirements.txt, every
# package pinned by hash) in a venv cached under ~/.cache/spark-kit/xet-client-<hash of that
# file>; prints the venv's python. Built once (needs PyPI), then reused offline.
#   bash tests/xet-venv.sh            # → /root/.cache/spark-kit/xet-client-…/bin/python
set -euo pipefail
req="$(cd "$(dirname "$0")" && pwd)/xet-requirements.txt"
key=$(sha256sum "$req" | cut -c1-16)
root="${XDG_CACHE_HOME:-$HOME/.cache}/spark-kit"
dir="$root/xet-client-$key"
mkdir -p "$root"
exec 9>"$dir.lock"
flock 9
if [ ! -e "$dir/.complete" ]; then
  rm -rf "$dir"
  python3 -m venv "$dir" >&2
  "$dir/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$req" >&2
  "$dir/bin/python" -c 'import huggingface_hub, hf_xet' >&2
  touch "$dir/.complete"
fi
echo "$dir/bin/python"
