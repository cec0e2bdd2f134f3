#!/usr/bin/env bash
# A newcomer's path, repeatable in a few minutes (not part of the default suite): a fresh clone of the
# committed tree into a temporary folder, a new virtual environment, then README.md's two commands as
# written, the first with a short fit instead of the full main job and the second on one quick test file.
#
#   bash tests/scripts/fresh_clone.sh [git-ref]        # default: HEAD of this checkout
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
ref=${1:-HEAD}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Nothing from this shell's Python setup may help the newcomer along.
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
export PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
git clone --quiet "$repo" "$tmp/zoo"
cd "$tmp/zoo"
git checkout --quiet "$ref"

# The README's first code block: two commands, comments and blank lines aside.
mapfile -t commands < <(sed -n '/^```bash$/,/^```$/p' README.md | sed '1d;$d' | grep -v '^#' | grep -v '^$' | head -2)
setup="${commands[0]} --trainer.max_epochs=1 --trainer.limit_train_batches=30 --trainer.limit_val_batches=5 --trainer.limit_test_batches=5"
tests="${commands[1]} -n 0 tests/test_readme.py tests/callbacks/test_monitors.py"

# Both commands in one shell, as the README says: the first activates the venv the second installs into.
echo "+ $setup"
echo "+ $tests"
bash -c "t0=\$SECONDS; $setup && t1=\$SECONDS && $tests && \
    echo \"fresh clone of $ref: both README commands passed (first \$((t1 - t0)) s, second \$((SECONDS - t1)) s)\"" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)  # pip: local index folders' misses
