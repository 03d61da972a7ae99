#!/bin/bash
# Run here, in a configured tree: stages what the GPU machine needs into .device/
# (ignored by git): the `make dist` tarball, Debian's libucx-dev (that machine has
# the UCX runtime but no headers), and run.sh. Then copy .device/ to the GPU machine's
# checkout and run there: bash .device/run.sh   (variables: see run.sh)
# BASE=<rev> also stages the tarball of that revision (.device/base/), against which
# run.sh then runs its A/B block: old and new builds in one device call.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
mkdir -p .git/info; grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device; mkdir -p .device/debs
make dist >/dev/null
mv "$(ls -t ./moea2a-*.tar.gz | head -1)" .device/
(cd .device/debs && apt-get download libucx-dev >/dev/null 2>&1) || {
  apt-get update >/dev/null && (cd .device/debs && apt-get download libucx-dev >/dev/null); }
cp bench/device/run.sh .device/
if [ -n "${BASE:-}" ]; then
  w=$(mktemp -d /tmp/moea2a-base.XXXXXX)
  git worktree add -q --detach "$w/src" "$BASE"
  (cd "$w/src" && ./autogen.sh && ./configure --without-cuda --without-nccl && make dist) >"$w/log" 2>&1 ||
    { tail -20 "$w/log"; exit 1; }
  mkdir -p .device/base && mv "$w"/src/moea2a-*.tar.gz .device/base/
  git worktree remove --force "$w/src"; rm -rf "$w"
  echo "base: $(git rev-parse --short "$BASE") staged in .device/base/"
fi
du -sh .device | awk '{print "staged .device/ (" $1 ")"}'
